#!/usr/bin/env python3
"""Llama 3.2 1B-shaped training-step benchmark in PyTorch 2 on a CUDA GPU.

The reference Nekton's CUDA trainer is measured against on the ~1B Llama
shape (the `llama-1b` preset: 16 layers, width 2048, 32 query heads and 8
key/value heads of 64, SwiGLU 8192, RMSNorm, RoPE theta 500000, vocabulary
128256, head tied to the embedding), on the same card in the same session,
with PyTorch's fastest standard path: f32 weights under bf16 autocast,
scaled_dot_product_attention (flash attention, causal, grouped-query), fused
AdamW and torch.compile. Random weights and tokens. MFU uses Nekton's formula
(ModelConfig::train_flops: Megatron's, with SwiGLU's three matrices and the
key/value heads' width) against --peak-tflops (H100/H200 dense bf16: 989).
The last line printed is a JSON object with the results.

  python3 bench/torch_llama_cuda_bench.py --batch 4 --seq 2048 --steps 10
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2_cuda_bench import cuda_bench_args, median_step_seconds  # noqa: E402


class RMSNorm(nn.Module):
    def __init__(self, c, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(c))

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight).to(x.dtype)


def rotate(x, cos, sin):  # x [B, H, T, D]; HF's rotate-half convention
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(nn.Module):
    def __init__(self, c, heads, kv_heads, ff):
        super().__init__()
        self.h, self.kv, self.d = heads, kv_heads, c // heads
        self.ln1, self.ln2 = RMSNorm(c), RMSNorm(c)
        self.q = nn.Linear(c, heads * self.d, bias=False)
        self.k = nn.Linear(c, kv_heads * self.d, bias=False)
        self.v = nn.Linear(c, kv_heads * self.d, bias=False)
        self.o = nn.Linear(heads * self.d, c, bias=False)
        self.gate = nn.Linear(c, ff, bias=False)
        self.up = nn.Linear(c, ff, bias=False)
        self.down = nn.Linear(ff, c, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        h = self.ln1(x)
        q = self.q(h).view(b, t, self.h, self.d).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv, self.d).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv, self.d).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, c))
        h = self.ln2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab, layers, c, heads, kv_heads, ff, max_t, theta):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.blocks = nn.ModuleList(Block(c, heads, kv_heads, ff) for _ in range(layers))
        self.ln_f = RMSNorm(c)
        d = c // heads
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        ang = torch.outer(torch.arange(max_t, dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx)
        cos, sin = self.cos[:t], self.sin[:t]
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def train_flops(tokens, t, layers, c, heads, kv_heads, ff, vocab):
    """Nekton's ModelConfig::train_flops for a dense SwiGLU Llama."""
    d = c // heads
    attn = c * (heads + 2 * kv_heads) * d + heads * d * c
    mlp = 3.0 * c * ff
    per_layer = 2.0 * (attn + mlp) + 4.0 * t * heads * d
    return 3.0 * (layers * per_layer + 2.0 * c * vocab) * tokens


def main():
    args = cuda_bench_args(__doc__, 4, 2048)
    torch.manual_seed(0)
    shape = dict(vocab=128256, layers=16, c=2048, heads=32, kv_heads=8, ff=8192)
    model = Llama(max_t=args.seq, theta=500000.0, **shape).cuda()
    med, loss = median_step_seconds(model, shape["vocab"], args)
    tokens = args.batch * args.seq
    flops = train_flops(tokens, args.seq, **shape)
    result = {"framework": "pytorch", "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(), "compile": not args.no_compile,
              "model": "llama-1b", "batch": args.batch, "seq": args.seq, "steps": args.steps,
              "step_s_median": med, "tokens_per_s": tokens / med,
              "achieved_tflops": flops / med / 1e12,
              "mfu": flops / med / 1e12 / args.peak_tflops, "final_loss": loss.item(),
              "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}
    print(f"torch {torch.__version__} on {result['gpu']}: median step {med * 1e3:.1f} ms, "
          f"{result['tokens_per_s']:.0f} tok/s, MFU {100 * result['mfu']:.1f}%")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
