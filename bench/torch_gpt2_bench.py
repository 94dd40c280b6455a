#!/usr/bin/python3
"""GPT-2 124M training-step benchmark in PyTorch 1.13 on the CPU.

The reference Nekton's CPU trainer is measured against (same model, batch and
optimizer): a self-contained GPT-2 (no transformers package), AdamW, fp32 or
bf16 autocast. Prints per-step times, tokens/s and, given --peak-tflops, MFU by
Megatron's formula; the last line is a JSON object with the results.

  /usr/bin/python3 bench/torch_gpt2_bench.py --dtype bf16 --steps 3 --threads 2
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_bench_util import require_optimised_blas, timed_steps  # noqa: E402


class Block(nn.Module):
    def __init__(self, h, n_head, max_t):
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)  # fused q, k, v: [h] -> [3h]
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc = nn.Linear(h, 4 * h)
        self.fc_proj = nn.Linear(4 * h, h)
        # Additive causal mask [1, 1, T, T]: -inf above the diagonal.
        mask = torch.full((max_t, max_t), float("-inf")).triu(1)
        self.register_buffer("mask", mask.view(1, 1, max_t, max_t), persistent=False)

    def attention(self, x):
        b, t, h = x.shape
        d = h // self.n_head
        q, k, v = self.qkv(x).split(h, dim=2)  # each [B, T, h]
        q, k, v = (z.view(b, t, self.n_head, d).transpose(1, 2) for z in (q, k, v))  # [B, H, T, D]
        # Manual softmax attention: 1.13 has no scaled_dot_product_attention.
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d)) + self.mask[:, :, :t, :t]
        att = att.float().softmax(dim=-1).to(v.dtype)
        y = (att @ v).transpose(1, 2).reshape(b, t, h)
        return self.proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab=50257, max_t=1024, layers=12, h=768, n_head=12):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(max_t, h)
        self.blocks = nn.ModuleList(Block(h, n_head, max_t) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied lm head: [B, T, V]
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def megatron_flops_per_step(b, t, layers, h, vocab):
    """Megatron-LM's training FLOPs per step (forward + backward, no recompute)."""
    return 72 * b * t * layers * h * h * (1 + t / (6 * h) + vocab / (12 * h * layers))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=0, help="0: all cores")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="hardware peak for MFU (omitted when not given)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    require_optimised_blas()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    vocab, layers, h = 50257, 12, 768
    model = GPT2(vocab=vocab, layers=layers, h=h)
    # Unfused AdamW: 1.13's AdamW has no `fused` argument, and on the CPU it runs
    # the per-parameter loop (foreach is a CUDA default).
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, foreach=False)
    idx = torch.randint(0, vocab, (args.batch, args.seq))
    targets = torch.randint(0, vocab, (args.batch, args.seq))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    tokens = args.batch * args.seq
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, "
          f"B={args.batch} T={args.seq}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params", flush=True)
    times, loss = timed_steps(step, args.warmup, args.steps, tokens)

    mean = sum(times) / len(times)
    flops = megatron_flops_per_step(args.batch, args.seq, layers, h, vocab)
    result = {
        "framework": "pytorch", "torch": torch.__version__, "dtype": args.dtype,
        "threads": torch.get_num_threads(), "batch": args.batch, "seq": args.seq,
        "steps": args.steps, "step_s_mean": mean, "step_s_min": min(times),
        "tokens_per_s": tokens / mean, "tokens_per_s_best": tokens / min(times),
        "model_tflops_per_step": flops / 1e12,
        "achieved_tflops": flops / mean / 1e12, "final_loss": loss,
    }
    if args.peak_tflops:
        result["peak_tflops"] = args.peak_tflops
        result["mfu"] = flops / mean / 1e12 / args.peak_tflops
        print(f"MFU {100 * result['mfu']:.1f}% of {args.peak_tflops} TFLOP/s")
    print(f"mean step {mean:.2f} s, {result['tokens_per_s']:.0f} tok/s, "
          f"{result['achieved_tflops'] * 1e3:.1f} GFLOP/s achieved")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
