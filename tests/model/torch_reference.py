#!/usr/bin/python3
"""Independent PyTorch implementation of Nekton's GPT-2 and Llama models, used
by torch_parity_test.cc. It reads the weights, batch and Nekton's results from
a folder, recomputes logits, loss, every parameter gradient and 5 AdamW steps,
and exits non-zero if any differs by more than the stated tolerance.

Written from the published architectures (GPT-2: LayerNorm, tanh-GELU, learned
positions, tied head; Llama: RMSNorm, Hugging Face rotate-half RoPE, SwiGLU,
grouped-query attention; Qwen2: Llama with q/k/v biases; Mistral: Llama with
sliding-window attention; RoPE scaling as transformers' modeling_rope_utils
defines linear, llama3 and yarn), not from Nekton's code.
"""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from safetensors_np import read_safetensors as read_numpy  # noqa: E402


def read_safetensors(path):
    return {k: torch.tensor(v) for k, v in read_numpy(path).items()}


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope(cfg, D):
    """Inverse frequencies [D/2] and the cos/sin scale, for Nekton's
    config.json "rope_scaling" (its names for Hugging Face's keys)."""
    theta = cfg["rope_theta"]
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    rs = cfg.get("rope_scaling", {"type": "none"})
    kind, factor = rs["type"], rs.get("factor", 1.0)
    if kind == "none":
        return inv, 1.0
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "llama3":  # by wavelength against the original context
        L, lo, hi = rs["original_max_seq_len"], rs["low_freq_factor"], rs["high_freq_factor"]
        wl = 2 * math.pi / inv
        s = (L / wl - lo) / (hi - lo)
        out = torch.where(wl > L / lo, inv / factor, (1 - s) * inv / factor + s * inv)
        return torch.where(wl < L / hi, inv, out), 1.0
    assert kind == "yarn", kind
    L = rs.get("original_max_seq_len") or cfg["max_seq_len"]

    def pair(rot):
        return D * math.log(L / (rot * 2 * math.pi)) / (2 * math.log(theta))

    lo = max(math.floor(pair(rs["beta_fast"])), 0)
    hi = min(math.ceil(pair(rs["beta_slow"])), D - 1)
    ramp = ((torch.arange(D // 2, dtype=torch.float64) - lo) / (hi - lo if hi > lo else 0.001)).clamp(0, 1)
    return inv / factor * ramp + inv * (1 - ramp), rs.get("attention_factor") or 0.1 * math.log(factor) + 1


def forward(cfg, P, tokens, adapter=None, embed=None, with_hidden=False):
    """Logits [B, T, V] (with_hidden: and the final norm's output [B, T, C]). `adapter`, if given, is a function (name, x, base) ->
    the output of linear `name` (e.g. "h.0.attn.qkv") for input x, where
    base(x) is the plain layer's: how PEFT's adapters wrap a layer. `embed`,
    if given, maps the token embeddings [B, T, C] to the model's input
    embeddings (Hugging Face's inputs_embeds; learned positions are added
    after it, as GPT-2 adds them to inputs_embeds)."""
    B, T = tokens.shape
    C, H, KV = cfg["d_model"], cfg["n_head"], cfg["n_kv_head"]
    D = C // H
    llama = cfg["arch"] in ("llama", "qwen2", "mistral")  # Qwen2's q/k/v biases: lin() adds them
    eps = cfg["norm_eps"]
    x = P["wte"][tokens]
    if embed is not None:
        x = embed(x)
    if not llama:
        x = x + P["wpe"][:T]
    else:
        inv_freq, scale = rope(cfg, D)
        ang = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
        emb = torch.cat((ang, ang), dim=-1)
        cos, sin = (emb.cos() * scale).float(), (emb.sin() * scale).float()
    mask = torch.full((T, T), float("-inf")).triu(1)
    if cfg.get("sliding_window"):  # Mistral: token i sees keys j > i - window
        mask = mask + torch.full((T, T), float("-inf")).tril(-cfg["sliding_window"])

    def norm(x, name):
        if llama:
            return rms_norm(x, P[name + ".weight"], eps)
        return torch.nn.functional.layer_norm(x, (C,), P[name + ".weight"], P[name + ".bias"], eps)

    def lin(x, name):
        def base(x):
            y = x @ P[name + ".weight"].t()
            return y + P[name + ".bias"] if (name + ".bias") in P else y

        return base(x) if adapter is None else adapter(name, x, base)

    for l in range(cfg["n_layer"]):
        p = f"h.{l}."
        qkv = lin(norm(x, p + "ln1"), p + "attn.qkv")
        q, k, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, KV, D).transpose(1, 2)
        v = v.view(B, T, KV, D).transpose(1, 2)
        if llama:
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(D) + mask
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * D)
        x = x + lin(y, p + "attn.proj")
        h = lin(norm(x, p + "ln2"), p + "mlp.up")
        if llama:
            g, u = h.split([cfg["d_ff"], cfg["d_ff"]], dim=-1)
            a = torch.nn.functional.silu(g) * u
        else:
            a = torch.nn.functional.gelu(h, approximate="tanh")
        x = x + lin(a, p + "mlp.down")
    x = norm(x, "ln_f")
    if cfg.get("num_labels", 0) > 0:  # a sequence classifier: its score head
        return x @ P["score.weight"].t()
    head = P["wte"] if cfg["tied_embeddings"] else P["lm_head.weight"]
    return (x @ head.t(), x) if with_hidden else x @ head.t()


def rel_err(got, want):
    return float((got - want).abs().max() / max(want.abs().max(), 1e-30))


class Checks:
    """Named comparisons against Nekton's results, one printed line each."""

    def __init__(self, tol):
        self.tol, self.failures = tol, []

    def check(self, name, got, want):
        e = rel_err(got, want) if got.shape == want.shape else math.inf  # inf: shapes differ
        self.expect(e <= self.tol, f"{name:32} rel err {e:.2e}", name)

    def expect(self, ok, line, name):
        if not ok:
            self.failures.append(name)
        print(f"{'ok' if ok else 'FAIL':4} {line}")

    def exit(self):
        if self.failures:
            print("FAILED:", ", ".join(self.failures))
            sys.exit(1)


def cross_entropy(logits, targets):
    V = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100)


def adamw_step_losses(groups, params, loss_fn, opt_cfg):
    """The loss before each of opt_cfg["steps"] AdamW updates of the PyTorch
    parameter groups `groups`, the gradients of `params` clipped to a global
    norm of opt_cfg["grad_clip"] first."""
    opt = torch.optim.AdamW(groups, lr=opt_cfg["lr"], betas=(opt_cfg["beta1"], opt_cfg["beta2"]), eps=opt_cfg["eps"])
    losses = []
    for _ in range(opt_cfg["steps"]):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, opt_cfg["grad_clip"])
        opt.step()
        losses.append(loss.item())
    return losses


def objective_parity(folder, tol, make_loss):
    """The check of tests/align/objective_steps.h's runs: the model of
    FOLDER/model in float64, make_loss(cfg, P0) -> loss_fn(P) (P0: the
    initial weights, for a reference computed from them), AdamW over the
    matrices with weight decay and the rest without, the steps of
    FOLDER/optim.json; each step's loss and every final weight against
    FOLDER/nekton.safetensors within `tol`; exits non-zero on a difference.
    With FOLDER/critic, its weights join P0 as "critic.NAME"."""
    cfg = json.load(open(f"{folder}/model/config.json"))
    opt_cfg = json.load(open(f"{folder}/optim.json"))
    ours = read_safetensors(f"{folder}/nekton.safetensors")
    P0 = {k: v.double() for k, v in read_safetensors(f"{folder}/model/model.safetensors").items()}
    # An objective's own model trained with the policy (PPO's critic):
    # its weights join P0 as "critic.NAME", one optimizer over both.
    if os.path.exists(f"{folder}/critic/model.safetensors"):
        C0 = read_safetensors(f"{folder}/critic/model.safetensors")
        P0.update({"critic." + k: v.double() for k, v in C0.items()})
    loss_fn = make_loss(cfg, P0)
    P = {k: v.clone().requires_grad_(True) for k, v in P0.items()}
    groups = []
    for critic in (False, True):  # a critic's at its own rate (optim.json's critic_lr_scale)
        mine = [p for k, p in P.items() if k.startswith("critic.") == critic]
        lr = opt_cfg["lr"] * (opt_cfg.get("critic_lr_scale", 1.0) if critic else 1.0)
        groups += [{"params": [p for p in mine if p.dim() >= 2], "lr": lr,
                    "weight_decay": opt_cfg["weight_decay"]},
                   {"params": [p for p in mine if p.dim() < 2], "lr": lr, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    losses = adamw_step_losses(groups, list(P.values()), lambda: loss_fn(P), opt_cfg)
    checks = Checks(tol)
    checks.check("step losses", ours["step_losses"].double(), torch.tensor(losses, dtype=torch.float64))
    print("nekton:", ours["step_losses"].tolist())
    print("torch: ", losses)
    for name, p in P.items():
        checks.check("weight " + name, ours["weight." + name].double(), p.detach())
    checks.exit()


def check_step_losses(checks, ours, losses):
    checks.check("adamw losses", ours["step_losses"].double(), torch.tensor(losses, dtype=torch.float64))
    print("nekton:", ours["step_losses"].tolist())
    print("torch: ", losses)


def main(folder, tol):
    cfg = json.load(open(f"{folder}/model/config.json"))
    P = {k: v.requires_grad_(True) for k, v in read_safetensors(f"{folder}/model/model.safetensors").items()}
    batch = read_safetensors(f"{folder}/batch.safetensors")
    ours = read_safetensors(f"{folder}/nekton.safetensors")
    tokens, targets = batch["tokens"].long(), batch["targets"].long()
    opt_cfg = json.load(open(f"{folder}/optim.json"))
    checks = Checks(tol)

    logits = forward(cfg, P, tokens)
    V = cfg["vocab_size"]
    loss = cross_entropy(logits, targets)
    loss.backward()
    checks.check("logits", ours["logits"], logits.detach().view(-1, V))
    checks.check("loss", ours["loss"], loss.detach().view(1))
    for name, p in P.items():
        checks.check("grad " + name, ours["grad." + name], p.grad)

    # Five AdamW steps from the same start, with global-norm clipping and
    # weight decay on matrices only, as Nekton's optimizer groups them.
    P = {k: v.detach().clone().requires_grad_(True) for k, v in read_safetensors(f"{folder}/model/model.safetensors").items()}
    decay = [p for p in P.values() if p.dim() >= 2]
    no_decay = [p for p in P.values() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": opt_cfg["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    losses = adamw_step_losses(groups, list(P.values()), lambda: cross_entropy(forward(cfg, P, tokens), targets), opt_cfg)
    check_step_losses(checks, ours, losses)
    checks.exit()


if __name__ == "__main__":
    torch.manual_seed(0)
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1e-4)
