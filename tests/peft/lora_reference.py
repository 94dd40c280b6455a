#!/usr/bin/python3
"""Independent PyTorch implementation of LoRA fine-tuning over Nekton's models,
used by Nekton's LoRA parity test. Usage:

    /usr/bin/python3 tests/peft/lora_reference.py FOLDER TOL

FOLDER holds the base model (model/, Nekton's format), a LoRA adapter in
Hugging Face PEFT's format (adapter/adapter_config.json and
adapter_model.safetensors), a batch (batch.safetensors), Nekton's results
(nekton.safetensors: logits, loss, grad.<adapter tensor>, step_losses) and
optim.json. With the base weights frozen and only the adapter trainable, this
recomputes logits, loss, every adapter gradient and the losses of AdamW steps,
and exits 1 if any differs from Nekton's by more than TOL (relative, as
max|ours - torch| / max|torch|).

Written from the LoRA paper (Hu et al. 2021: h = W x + (alpha / r) B A x, or
alpha / sqrt(r) with rsLoRA) and PEFT's documented adapter format (tensor names,
lora_A [r, in], lora_B [out, r], adapter_config.json keys), not from PEFT's
code. Dropout is not applied: the test runs without it. The model itself is
tests/model/torch_reference.py's forward, with each adapter's output added to
the columns of the fused Nekton linear its module stands for.
"""
import json
import math
import os
import re
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model"))
from torch_reference import Checks, adamw_step_losses, check_step_losses, cross_entropy, forward, read_safetensors  # noqa: E402

LLAMA_NAME = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")
GPT2_NAME = re.compile(r"base_model\.model\.transformer\.h\.(\d+)\.(attn|mlp)\.(\w+)\.lora_([AB])\.weight")


def module_rows(cfg):
    """{(block, module): (Nekton linear, first output row, end row or None = all)}."""
    H, KV, F = cfg["n_head"], cfg["n_kv_head"], cfg["d_ff"]
    D = cfg["d_model"] // H
    if cfg["arch"] == "gpt2":
        return {("attn", "c_attn"): ("attn.qkv", 0, None), ("attn", "c_proj"): ("attn.proj", 0, None),
                ("mlp", "c_fc"): ("mlp.up", 0, None), ("mlp", "c_proj"): ("mlp.down", 0, None)}
    assert cfg["arch"] in ("llama", "qwen2", "mistral"), cfg["arch"]
    q, k = H * D, KV * D
    return {("self_attn", "q_proj"): ("attn.qkv", 0, q), ("self_attn", "k_proj"): ("attn.qkv", q, q + k),
            ("self_attn", "v_proj"): ("attn.qkv", q + k, q + 2 * k), ("self_attn", "o_proj"): ("attn.proj", 0, None),
            ("mlp", "gate_proj"): ("mlp.up", 0, F), ("mlp", "up_proj"): ("mlp.up", F, 2 * F),
            ("mlp", "down_proj"): ("mlp.down", 0, None)}


def adapter_modules(cfg, acfg, names, P):
    """{Nekton linear: [(first row, end row, A name, B name)] by row}, checking
    names, shapes and that each module is targeted and has both A and B."""
    pattern = GPT2_NAME if cfg["arch"] == "gpt2" else LLAMA_NAME
    rows, targets, found = module_rows(cfg), acfg["target_modules"], {}
    for name in names:
        m = pattern.fullmatch(name)
        if not m or (m[2], m[3]) not in rows or int(m[1]) >= cfg["n_layer"]:
            sys.exit(f"adapter tensor {name}: not a LoRA module of a {cfg['arch']} layer")
        if isinstance(targets, list) and m[3] not in targets:
            sys.exit(f"adapter tensor {name}: module {m[3]} is not in target_modules {targets}")
        found.setdefault((int(m[1]), m[2], m[3]), {})[m[4]] = name
    out = {}
    for (l, block, module), ab in sorted(found.items()):
        if set(ab) != {"A", "B"}:
            sys.exit(f"layer {l} {module}: has lora_{''.join(ab)} only")
        base, start, end = rows[(block, module)]
        base = f"h.{l}.{base}"
        W = P[base + ".weight"]
        end = W.shape[0] if end is None else end
        A, B = P[ab["A"]], P[ab["B"]]
        want_a, want_b = (acfg["r"], W.shape[1]), (end - start, acfg["r"])
        if tuple(A.shape) != want_a or tuple(B.shape) != want_b:
            sys.exit(f"layer {l} {module}: lora_A {list(A.shape)}, lora_B {list(B.shape)}; "
                     f"expected {list(want_a)} and {list(want_b)}")
        out.setdefault(base, []).append((start, end, ab["A"], ab["B"]))
    return {k: sorted(v) for k, v in out.items()}


def main(folder, tol):
    cfg = json.load(open(f"{folder}/model/config.json"))
    acfg = json.load(open(f"{folder}/adapter/adapter_config.json"))
    assert acfg.get("peft_type") == "LORA", acfg.get("peft_type")
    r, alpha = acfg["r"], acfg["lora_alpha"]
    scaling = alpha / math.sqrt(r) if acfg.get("use_rslora", False) else alpha / r
    base = read_safetensors(f"{folder}/model/model.safetensors")
    start = read_safetensors(f"{folder}/adapter/adapter_model.safetensors")
    batch = read_safetensors(f"{folder}/batch.safetensors")
    ours = read_safetensors(f"{folder}/nekton.safetensors")
    opt_cfg = json.load(open(f"{folder}/optim.json"))
    tokens, targets = batch["tokens"].long(), batch["targets"].long()
    V = cfg["vocab_size"]
    P = {k: v.clone() for k, v in base.items()}  # frozen: requires_grad stays False
    mods = adapter_modules(cfg, acfg, start, {**P, **start})
    checks = Checks(tol)

    def loss_of(L):
        def lora(name, x):
            if name not in mods:
                return None
            parts, row = [], 0
            for s, e, a, b in mods[name]:  # zeros for the rows no adapter targets
                parts += [x.new_zeros(*x.shape[:-1], s - row), scaling * ((x @ L[a].t()) @ L[b].t())]
                row = e
            parts.append(x.new_zeros(*x.shape[:-1], P[name + ".weight"].shape[0] - row))
            return torch.cat(parts, dim=-1)

        logits = forward(cfg, P, tokens, lora=lora)
        return logits, cross_entropy(logits, targets)

    def fresh_adapter():
        return {k: v.clone().requires_grad_(True) for k, v in start.items()}

    L = fresh_adapter()
    logits, loss = loss_of(L)
    loss.backward()
    checks.check("logits", ours["logits"], logits.detach().view(-1, V))
    checks.check("loss", ours["loss"], loss.detach().view(1))
    grads = {k[len("grad."):] for k in ours if k.startswith("grad.")}
    for name in sorted(grads - set(L)):
        checks.expect(False, f"grad.{name}: not an adapter tensor", "grad." + name)
    for name, p in L.items():
        if name not in grads:
            checks.expect(False, f"grad.{name}: missing from nekton.safetensors", "grad." + name)
        else:
            checks.check("grad " + name, ours["grad." + name], p.grad)

    # AdamW steps from the same start over the adapter only: decay on every
    # (2-d) adapter matrix, global-norm clipping of the adapter's gradients.
    L = fresh_adapter()
    groups = [{"params": list(L.values()), "weight_decay": opt_cfg["weight_decay"]}]
    losses = adamw_step_losses(groups, list(L.values()), lambda: loss_of(L)[1], opt_cfg)
    check_step_losses(checks, ours, losses)
    checks.exit()


if __name__ == "__main__":
    torch.manual_seed(0)
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1e-4)
