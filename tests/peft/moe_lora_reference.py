#!/usr/bin/python3
"""Independent float64 PyTorch LoRA over a Hugging Face Mixture-of-Experts
checkpoint (Mixtral, Qwen2-MoE, Qwen3-MoE), used by Nekton's MoE LoRA parity
test (tests/ckpt/moe_lora_test.cc). Usage:

    moe_lora_reference.py HF_DIR ADAPTER_DIR BATCH.safetensors OUT.safetensors AUX Z

HF_DIR is the base model in Hugging Face's layout, ADAPTER_DIR an adapter in
PEFT's format (adapter_config.json + adapter_model.safetensors), BATCH holds
"tokens" and "targets" [B, T]. Writes OUT with "loss" [total, ce, aux, z]
(the training loss: mean cross-entropy + AUX x the load-balancing loss + Z x
the router z-loss), "logits" [B*T, V], and, for every tensor of the adapter
file, its gradient under the file's name.

Written from the LoRA paper (h = W x + (alpha / r) B A x, alpha / sqrt(r)
with rsLoRA) and PEFT's documented format, not from PEFT's or Nekton's code:
every nn.Linear whose module path ends with a target_modules entry (as a
whole dotted component) carries lora_A [r, in] and lora_B [out, r], named
base_model.model.<module>.lora_A.weight; Mixtral's per-expert
block_sparse_moe.experts.E.w1/w2/w3 and Qwen-MoE's
mlp.experts.E.gate_proj/up_proj/down_proj are each such a module, with its
own A and B. modules_to_save (a router) are held whole as
base_model.model.<module>.weight and trained. The model is
tests/ckpt/hf_reference.py's (transformers' equations, the MoE blocks
computed densely), with each adapted weight replaced by W + s B A: the same
function of A and B as adding s B A x to the module's output.

The checker also asserts the file is complete: every module the
target_modules select has its A and B there, and nothing else is.
"""
import json
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ckpt"))
sys.path.insert(0, os.path.join(HERE, ".."))
from hf_reference import QKV_BIAS, llama_logits, load_balancing_loss, read_hf_weights, router_z_loss  # noqa: E402
from safetensors_np import read_safetensors, write_safetensors  # noqa: E402

PREFIX = "base_model.model."


def selected(module, targets):
    if targets == "all-linear":
        raise SystemExit("all-linear: the reference wants the modules by name")
    return any(module == t or module.endswith("." + t) for t in targets)


def main(hf_dir, adapter_dir, batch_path, out_path, aux_coef, z_coef):
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        ac = json.load(f)
    assert ac["peft_type"] == "LORA", ac["peft_type"]
    r, alpha = ac["r"], ac["lora_alpha"]
    scale = alpha / math.sqrt(r) if ac.get("use_rslora") else alpha / r
    targets = ac["target_modules"]
    saved = ac.get("modules_to_save") or []
    W = {k: torch.tensor(v, dtype=torch.float64) for k, v in read_hf_weights(hf_dir).items()}
    A = {k: torch.tensor(v, dtype=torch.float64).requires_grad_(True)
         for k, v in read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors")).items()}

    # The modules the config selects: every 2-d weight of the blocks (PEFT's
    # nn.Linear layers there) whose path matches, but not modules_to_save.
    want = set()
    for name, w in W.items():
        module = name[: -len(".weight")]
        if not name.endswith(".weight") or w.dim() != 2 or ".layers." not in name:
            continue
        if any(module.endswith("." + m) or module == m for m in saved):
            want.add(PREFIX + module + ".weight")
            continue
        if selected(module, targets):
            want.add(PREFIX + module + ".lora_A.weight")
            want.add(PREFIX + module + ".lora_B.weight")
    if set(A) != want:
        print("adapter tensors differ from what the config selects:")
        print("  missing:", sorted(want - set(A))[:10])
        print("  extra:", sorted(set(A) - want)[:10])
        return 1

    weights = dict(W)
    for name, t in A.items():
        if name.endswith(".lora_A.weight"):
            module = name[len(PREFIX): -len(".lora_A.weight")]
            b = A[PREFIX + module + ".lora_B.weight"]
            assert t.shape == (r, W[module + ".weight"].shape[1]), (name, t.shape)
            assert b.shape == (W[module + ".weight"].shape[0], r), (name, b.shape)
            weights[module + ".weight"] = W[module + ".weight"] + scale * (b @ t)
        elif not name.endswith(".lora_B.weight"):  # a module saved whole (the router)
            module = name[len(PREFIX):]
            assert t.shape == W[module].shape, (name, t.shape)
            weights[module] = t

    R = read_safetensors(batch_path)
    tokens = torch.as_tensor(R["tokens"], dtype=torch.long)
    targets_t = torch.as_tensor(R["targets"], dtype=torch.long).reshape(-1)
    routers = []
    logits = llama_logits(cfg, weights, tokens, cfg["architectures"][0] in QKV_BIAS, routers=routers)
    logits = logits.reshape(-1, logits.shape[-1])
    ce = torch.nn.functional.cross_entropy(logits, targets_t, ignore_index=-100)
    aux = load_balancing_loss(cfg, routers)
    z = router_z_loss(routers)
    loss = ce + aux_coef * aux + z_coef * z
    loss.backward()
    out = [("loss", np.array([loss.item(), ce.item(), aux.item(), z.item()])),
           ("logits", logits.detach().numpy())]
    out += [(k, v.grad.numpy()) for k, v in sorted(A.items())]
    write_safetensors(out_path, out, "F32")
    return 0


if __name__ == "__main__":
    a = sys.argv[1:]
    sys.exit(main(a[0], a[1], a[2], a[3], float(a[4]), float(a[5])))
