#!/usr/bin/env python3
"""GPT-2 124M training-step benchmark in PyTorch 2 on a CUDA GPU.

The reference Nekton's CUDA trainer is measured against, on the same card in
the same session: torch_gpt2_bench.py's GPT-2 (same layers, tied head, GELU
tanh, AdamW) given PyTorch's fastest standard path: bf16 autocast,
scaled_dot_product_attention (flash attention, causal), fused AdamW and
torch.compile. Prints per-step times, tokens/s and MFU against --peak-tflops
(H100/H200 dense bf16: 989); the last line is a JSON object with the results.

  python3 bench/torch_gpt2_cuda_bench.py --batch 16 --seq 1024 --steps 10
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2_bench import GPT2, Block, megatron_flops_per_step  # noqa: E402


def sdpa_attention(self, x):
    b, t, h = x.shape
    d = h // self.n_head
    q, k, v = self.qkv(x).split(h, dim=2)
    q, k, v = (z.view(b, t, self.n_head, d).transpose(1, 2) for z in (q, k, v))  # [B, H, T, D]
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.proj(y.transpose(1, 2).reshape(b, t, h))


def cuda_bench_args(description, batch, seq):
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--seq", type=int, default=seq)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    return ap.parse_args()


def median_step_seconds(model, vocab, args):
    """Trains `model` (on the GPU; forward(idx, targets) -> loss) on random
    tokens with PyTorch's fastest standard path: bf16 autocast, fused AdamW,
    torch.compile unless --no-compile. args.warmup untimed steps, then the
    median of args.steps timed by CUDA events (seconds), and the last loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    fwd = model if args.no_compile else torch.compile(model)
    idx = torch.randint(0, vocab, (args.batch, args.seq), device="cuda")
    targets = torch.randint(0, vocab, (args.batch, args.seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(args.steps):
        start.record()
        loss = step()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    times.sort()
    return times[len(times) // 2], loss


def main():
    args = cuda_bench_args(__doc__, 16, 1024)
    torch.manual_seed(0)
    Block.attention = sdpa_attention
    vocab, layers, h = 50257, 12, 768
    model = GPT2(vocab=vocab, max_t=args.seq, layers=layers, h=h).cuda()
    med, loss = median_step_seconds(model, vocab, args)
    tokens = args.batch * args.seq
    flops = megatron_flops_per_step(args.batch, args.seq, layers, h, vocab)
    result = {"framework": "pytorch", "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(), "compile": not args.no_compile,
              "batch": args.batch, "seq": args.seq, "steps": args.steps,
              "step_s_median": med, "tokens_per_s": tokens / med,
              "achieved_tflops": flops / med / 1e12,
              "mfu": flops / med / 1e12 / args.peak_tflops, "final_loss": loss.item()}
    print(f"torch {torch.__version__} on {result['gpu']}: median step {med * 1e3:.1f} ms, "
          f"{result['tokens_per_s']:.0f} tok/s, MFU {100 * result['mfu']:.1f}%")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
