#!/usr/bin/python3
"""Independent PyTorch implementation of LoRA, IA3, bottleneck-adapter and
p-tuning fine-tuning over Nekton's models, used by Nekton's adapter parity
tests. Usage:

    /usr/bin/python3 tests/peft/peft_reference.py FOLDER TOL

FOLDER holds the base model (model/, Nekton's format), an adapter in Hugging
Face PEFT's format (adapter/adapter_config.json and
adapter_model.safetensors), a batch (batch.safetensors), Nekton's results
(nekton.safetensors: logits, loss, grad.<adapter tensor>, step_losses) and
optim.json. With the base weights frozen and only the adapter trainable, this
recomputes logits, loss, every adapter gradient and the losses of AdamW steps,
and exits 1 if any differs from Nekton's by more than TOL (relative, as
max|ours - torch| / max|torch|).

P-tuning: PEFT's file holds the prompt encoder's output only
(prompt_embeddings), so FOLDER also has ptuning.safetensors, the trainable
encoder under PEFT's training names (prompt_encoder.default.embedding.weight
and .mlp_head.{0,2,4}.{weight,bias}); the gradients are those tensors'. The
file's prompt_embeddings must equal the encoder's output.

Written from the LoRA paper (Hu et al. 2021: h = W x + (alpha / r) B A x, or
alpha / sqrt(r) with rsLoRA), the (IA)^3 paper (Liu et al. 2022: learned
vectors l rescaling a layer's output, l * (W x + b), or for PEFT's
feedforward_modules its input, W (l * x) + b) and PEFT's documented adapter
format (tensor names, lora_A [r, in], lora_B [out, r], ia3_l [out, 1] or
[1, in], adapter_config.json keys), not from PEFT's code; bottleneck
adapters from Houlsby et al. 2019 in NeMo's documented pre-norm form (y +
W_out silu(W_in LayerNorm(y)) after the attention output and MLP down
projections); p-tuning from Liu et al. 2021 with PEFT's documented MLP
reparameterisation (Linear, ReLU, Linear, ReLU, Linear; virtual tokens
prepended as input embeddings, ignored by the loss). Vectors (IA3's, norms,
biases) get no weight decay, matrices do, as Nekton's optimizer groups them. Dropout is not applied: the test runs without it. The model itself is
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

KINDS = r"(lora_A\.weight|lora_B\.weight|ia3_l|adapter\.layer_norm\.weight|adapter\.layer_norm\.bias|adapter\.linear_in\.weight|adapter\.linear_out\.weight)"
LLAMA_NAME = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\." + KINDS)
GPT2_NAME = re.compile(r"base_model\.model\.transformer\.h\.(\d+)\.(attn|mlp)\.(\w+)\." + KINDS)
BOTTLENECK_KINDS = {"adapter.layer_norm.weight", "adapter.layer_norm.bias", "adapter.linear_in.weight", "adapter.linear_out.weight"}


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
            ("mlp", "down_proj"): ("mlp.down", 0, None),
            # a bottleneck adapter on a whole fused layer, by Megatron's name
            ("self_attn", "linear_qkv"): ("attn.qkv", 0, None), ("mlp", "linear_fc1"): ("mlp.up", 0, None)}


def megatron_name(cfg, block, module):
    """Megatron's name of a Hugging Face module (Nekton accepts both)."""
    if cfg["arch"] == "gpt2":
        return {("attn", "c_attn"): "linear_qkv", ("attn", "c_proj"): "linear_proj",
                ("mlp", "c_fc"): "linear_fc1", ("mlp", "c_proj"): "linear_fc2"}[(block, module)]
    return {"q_proj": "linear_qkv", "k_proj": "linear_qkv", "v_proj": "linear_qkv", "linear_qkv": "linear_qkv",
            "o_proj": "linear_proj", "gate_proj": "linear_fc1", "up_proj": "linear_fc1", "linear_fc1": "linear_fc1",
            "down_proj": "linear_fc2"}[module]


def adapter_modules(cfg, acfg, names, P):
    """{Nekton linear: [(first row, end row, module, {kind: tensor name})] by
    row}, kind "lora_A.weight", "lora_B.weight" or "ia3_l", checking names,
    shapes and that each module is targeted and complete."""
    pattern = GPT2_NAME if cfg["arch"] == "gpt2" else LLAMA_NAME
    lora, bottleneck = acfg["peft_type"] == "LORA", acfg["peft_type"] == "BOTTLENECK_ADAPTER"
    want_kinds = {"lora_A.weight", "lora_B.weight"} if lora else BOTTLENECK_KINDS if bottleneck else {"ia3_l"}
    ff = set(acfg.get("feedforward_modules") or [])
    rows, targets, found = module_rows(cfg), acfg["target_modules"], {}
    for name in names:
        m = pattern.fullmatch(name)
        if not m or (m[2], m[3]) not in rows or int(m[1]) >= cfg["n_layer"] or m[4] not in want_kinds:
            sys.exit(f"adapter tensor {name}: not a {acfg['peft_type']} tensor of a {cfg['arch']} layer")
        if isinstance(targets, list) and not ({m[3], f"{m[2]}.{m[3]}", megatron_name(cfg, m[2], m[3])} & set(targets)):
            sys.exit(f"adapter tensor {name}: module {m[3]} is not in target_modules {targets}")
        found.setdefault((int(m[1]), m[2], m[3]), {})[m[4]] = name
    out = {}
    for (l, block, module), kinds in sorted(found.items()):
        if set(kinds) != want_kinds:
            sys.exit(f"layer {l} {module}: has {sorted(kinds)} only")
        base, start, end = rows[(block, module)]
        base = f"h.{l}.{base}"
        W = P[base + ".weight"]
        end = W.shape[0] if end is None else end
        if lora:
            want = {"lora_A.weight": (acfg["r"], W.shape[1]), "lora_B.weight": (end - start, acfg["r"])}
        elif bottleneck:
            if (start, end) != (0, W.shape[0]):
                sys.exit(f"layer {l} {module}: a bottleneck adapter on part of a layer")
            out_dim, dim = W.shape[0], acfg["adapter_dim"]
            want = {"adapter.layer_norm.weight": (out_dim,), "adapter.layer_norm.bias": (out_dim,),
                    "adapter.linear_in.weight": (dim, out_dim), "adapter.linear_out.weight": (out_dim, dim)}
        else:
            feedforward = module in ff or f"{block}.{module}" in ff
            want = {"ia3_l": (1, W.shape[1]) if feedforward else (end - start, 1)}
        for kind, shape in want.items():
            if tuple(P[kinds[kind]].shape) != shape:
                sys.exit(f"layer {l} {module}: {kind} {list(P[kinds[kind]].shape)}, expected {list(shape)}")
        out.setdefault(base, []).append((start, end, module, kinds))
    return {k: sorted(v) for k, v in out.items()}


def lora_adapter(mods, P, scaling):
    """(name, x, base) -> base(x) plus each LoRA module's scaling * x A^T B^T
    in its rows (zeros elsewhere)."""
    def adapt(name, x, base, L):
        y = base(x)
        if name not in mods:
            return y
        parts, row = [], 0
        for s, e, _, t in mods[name]:
            parts += [x.new_zeros(*x.shape[:-1], s - row),
                      scaling * ((x @ L[t["lora_A.weight"]].t()) @ L[t["lora_B.weight"]].t())]
            row = e
        parts.append(x.new_zeros(*x.shape[:-1], y.shape[-1] - row))
        return y + torch.cat(parts, dim=-1)
    return adapt


def ia3_adapter(mods, P):
    """(name, x, base) -> IA3: a feedforward module's input times its [1, in]
    vector, other modules' output rows times their [rows, 1] vectors."""
    def adapt(name, x, base, L):
        if name not in mods:
            return base(x)
        mine = mods[name]
        ff = [t["ia3_l"] for _, _, _, t in mine if L[t["ia3_l"]].shape[0] == 1]
        if ff:
            return base(x * L[ff[0]].view(-1))
        y = base(x)
        scale, row = [], 0
        for s, e, _, t in mine:
            scale += [y.new_ones(s - row), L[t["ia3_l"]].view(-1)]
            row = e
        scale.append(y.new_ones(y.shape[-1] - row))
        return y * torch.cat(scale)
    return adapt


def bottleneck_adapter(mods, eps):
    """(name, x, base) -> y + W_out silu(W_in LayerNorm(y)), y = base(x)."""
    def adapt(name, x, base, L):
        y = base(x)
        if name not in mods:
            return y
        (_, _, _, t), = mods[name]
        ln = torch.nn.functional.layer_norm(y, (y.shape[-1],), L[t["adapter.layer_norm.weight"]],
                                            L[t["adapter.layer_norm.bias"]], eps)
        h = torch.nn.functional.silu(ln @ L[t["adapter.linear_in.weight"]].t())
        return y + h @ L[t["adapter.linear_out.weight"]].t()
    return adapt


ENCODER = "prompt_encoder.default."


def prompt_of(L):
    """PEFT's MLP prompt encoder over its embedding table: [n, C]."""
    h = L[ENCODER + "embedding.weight"]
    for i in (0, 2, 4):
        h = h @ L[f"{ENCODER}mlp_head.{i}.weight"].t() + L[f"{ENCODER}mlp_head.{i}.bias"]
        if i < 4:
            h = torch.relu(h)
    return h


def main(folder, tol):
    cfg = json.load(open(f"{folder}/model/config.json"))
    acfg = json.load(open(f"{folder}/adapter/adapter_config.json"))
    kind = acfg.get("peft_type")
    assert kind in ("LORA", "IA3", "BOTTLENECK_ADAPTER", "P_TUNING"), kind
    base = read_safetensors(f"{folder}/model/model.safetensors")
    start = read_safetensors(f"{folder}/adapter/adapter_model.safetensors")
    checks = Checks(tol)
    if kind == "P_TUNING":
        saved = start
        start = read_safetensors(f"{folder}/ptuning.safetensors")
        n, C = acfg["num_virtual_tokens"], acfg["token_dim"]
        checks.expect(set(saved) == {"prompt_embeddings"} and tuple(saved["prompt_embeddings"].shape) == (n, C),
                      f"adapter tensors {sorted(saved)}: expected prompt_embeddings [{n}, {C}]", "adapter")
        checks.check("saved prompt_embeddings", saved["prompt_embeddings"], prompt_of(start))
    batch = read_safetensors(f"{folder}/batch.safetensors")
    ours = read_safetensors(f"{folder}/nekton.safetensors")
    opt_cfg = json.load(open(f"{folder}/optim.json"))
    tokens, targets = batch["tokens"].long(), batch["targets"].long()
    V = cfg["vocab_size"]
    P = {k: v.clone() for k, v in base.items()}  # frozen: requires_grad stays False
    mods = adapter_modules(cfg, acfg, start, {**P, **start}) if kind != "P_TUNING" else {}

    embed = None
    if kind == "LORA":
        r, alpha = acfg["r"], acfg["lora_alpha"]
        adapt = lora_adapter(mods, P, alpha / math.sqrt(r) if acfg.get("use_rslora", False) else alpha / r)
    elif kind == "IA3":
        adapt = ia3_adapter(mods, P)
    elif kind == "BOTTLENECK_ADAPTER":
        assert acfg["norm_position"] == "pre" and acfg["activation"] == "swish", acfg
        adapt = bottleneck_adapter(mods, acfg["norm_eps"])
    else:
        adapt = None

        def embed(x, L):  # the virtual tokens take the first n positions of every row
            p = prompt_of(L)
            return torch.cat((p.unsqueeze(0).expand(x.shape[0], -1, -1), x[:, p.shape[0]:]), dim=1)

    def loss_of(L):
        logits = forward(cfg, P, tokens,
                         adapter=None if adapt is None else lambda name, x, base: adapt(name, x, base, L),
                         embed=None if embed is None else lambda x: embed(x, L))
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
    # adapter matrix, global-norm clipping of the adapter's gradients.
    L = fresh_adapter()

    def decayed(name):  # IA3's [out, 1] / [1, in] files hold vectors
        return L[name].dim() >= 2 and not name.endswith(".ia3_l")
    groups = [{"params": [p for k, p in L.items() if decayed(k)], "weight_decay": opt_cfg["weight_decay"]},
              {"params": [p for k, p in L.items() if not decayed(k)], "weight_decay": 0.0}]
    losses = adamw_step_losses(groups, list(L.values()), lambda: loss_of(L)[1], opt_cfg)
    check_step_losses(checks, ours, losses)
    checks.exit()


if __name__ == "__main__":
    torch.manual_seed(0)
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1e-4)
