#!/usr/bin/python3
"""LoRA fine-tuning step on the Llama 3.2 1B shape in PyTorch 1.13 on the CPU.

The reference for `bench/run_lora_bench.sh`: a self-contained Llama (no
transformers or peft package): RMSNorm, rotate-half RoPE, grouped-query
attention with a causal mask (matmul + softmax: 1.13 has no
scaled_dot_product_attention), SwiGLU MLP, tied LM head, cross-entropy.

--mode lora (default): the base weights are random, frozen and stored in bf16
(half the memory of fp32; the best set-up for a frozen base). LoRA A/B
(rank --rank, scale --alpha / --rank) on q, k, v, o, gate, up and down are
fp32 parameters (Hugging Face PEFT's "all-linear": not the LM head). The step
runs under torch.autocast("cpu", bfloat16); AdamW (foreach=False, weight decay
0.1 as Nekton applies it to matrices) updates the LoRA parameters only.
--mode full: every weight is an fp32 trainable parameter (bf16 autocast),
AdamW over all of them: the full-SFT comparison row, on a smaller shape
(--layers).

--dtype fp32: no autocast, and a lora base stored in fp32 (--base-dtype
overrides the storage). Use it where this PyTorch has no fast bf16 product:
Debian's 1.13 multiplies bf16 through oneDNN only on AVX-512 CPUs and falls
back to ~1-5 GFLOP/s elsewhere (--probe measures both).

--objective dpo: the step of `nekton align align.method=dpo` instead of the
LM loss: the batch is pairs of rows (chosen, rejected), each row's
completion log-probability (the last --completion tokens), DPO's sigmoid
loss -log s(beta ((c - c_ref) - (r - r_ref))). The reference log-
probabilities: with --mode lora the same model with its adapters switched
off (a no-grad forward first, as TRL with a PEFT model and Nekton's
align.reference=adapter_off); with --mode full precomputed once before the
timed steps (TRL's precompute_ref_log_probs, Nekton's align.reference=
precompute), so a step is the policy's forward and backward alone.

Both modes clip the gradient norm to --grad-clip (Nekton's default 1.0).
Tokens are random ids over the whole vocabulary (speed does not depend on
them). The last two lines are a parseable RESULT line and a JSON object.

  /usr/bin/python3 bench/torch_lora_bench.py --steps 2 --warmup 1 --threads 2
  /usr/bin/python3 bench/torch_lora_bench.py --shape tiny --seq 128   # smoke test
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_bench_util import require_optimised_blas, timed_steps  # noqa: E402

# Llama 3.2 1B (Nekton's llama-1b) and Nekton's llama-tiny (for smoke tests).
SHAPES = {
    "1b": dict(layers=16, d=2048, heads=32, kv_heads=8, d_ff=8192, vocab=128256,
               theta=500000.0, tied=True),
    "tiny": dict(layers=2, d=64, heads=4, kv_heads=2, d_ff=176, vocab=257,
                 theta=10000.0, tied=False),
}


def rand_weight(shape, dtype, std, gen, chunk=1 << 24):
    """Random normal(0, std) tensor of `dtype`, filled in fp32 chunks of 16M values.

    bf16 normal_() directly is ~4x slower on this CPU than fp32 normal_ and a
    cast; chunking keeps the fp32 temporary at 64 MiB for the 128256 x 2048
    embedding.
    """
    out = torch.empty(shape, dtype=dtype)
    flat = out.view(-1)
    for i in range(0, flat.numel(), chunk):
        j = min(i + chunk, flat.numel())
        flat[i:j].copy_(torch.empty(j - i).normal_(0.0, std, generator=gen))
    return out


class LoRALinear(nn.Module):
    """y = x W^T + (x A^T B^T) * alpha / r, W frozen (lora) or trainable (full)."""

    off = False  # every adapter switched off: the base model (DPO's reference)

    def __init__(self, n_in, n_out, gen, mode, rank, alpha, wdt, std=0.02):
        super().__init__()
        full = mode == "full"
        w = rand_weight((n_out, n_in), wdt, std, gen)
        self.weight = nn.Parameter(w, requires_grad=full)
        self.lora = mode == "lora"
        if self.lora:
            self.scale = alpha / rank
            # PEFT's initialisation: A Kaiming-uniform with a = sqrt 5, i.e.
            # U(-1/sqrt(n_in), 1/sqrt(n_in)); B zeros.
            bound = 1.0 / math.sqrt(n_in)
            self.lora_A = nn.Parameter(torch.empty(rank, n_in).uniform_(-bound, bound, generator=gen))
            self.lora_B = nn.Parameter(torch.zeros(n_out, rank))

    def forward(self, x):
        y = F.linear(x, self.weight)
        if self.lora and not LoRALinear.off:
            y = y + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scale
        return y


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5, trainable=False):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d), requires_grad=trainable)

    def forward(self, x):
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Block(nn.Module):
    def __init__(self, s, gen, mode, rank, alpha, wdt):
        super().__init__()
        d, dh = s["d"], s["d"] // s["heads"]
        self.h, self.kv, self.dh = s["heads"], s["kv_heads"], dh
        lin = lambda i, o: LoRALinear(i, o, gen, mode, rank, alpha, wdt)
        full = mode == "full"
        self.ln1 = RMSNorm(d, trainable=full)
        self.q = lin(d, self.h * dh)
        self.k = lin(d, self.kv * dh)
        self.v = lin(d, self.kv * dh)
        self.o = lin(self.h * dh, d)
        self.ln2 = RMSNorm(d, trainable=full)
        self.gate = lin(d, s["d_ff"])
        self.up = lin(d, s["d_ff"])
        self.down = lin(s["d_ff"], d)

    def attention(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.h, self.dh).transpose(1, 2)  # [B, H, T, D]
        k = self.k(x).view(b, t, self.kv, self.dh).transpose(1, 2)  # [B, KV, T, D]
        v = self.v(x).view(b, t, self.kv, self.dh).transpose(1, 2)
        cq, sq = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cq + rotate_half(q) * sq
        k = k * cq + rotate_half(k) * sq
        g = self.h // self.kv  # grouped-query: each kv head serves g query heads
        k = k[:, :, None].expand(b, self.kv, g, t, self.dh).reshape(b, self.h, t, self.dh)
        v = v[:, :, None].expand(b, self.kv, g, t, self.dh).reshape(b, self.h, t, self.dh)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.dh))
        att = (att.float() + mask).softmax(dim=-1).to(v.dtype)
        y = (att @ v).transpose(1, 2).reshape(b, t, self.h * self.dh)
        return self.o(y)

    def forward(self, x, cos, sin, mask):
        x = x + self.attention(self.ln1(x), cos, sin, mask)
        h = self.ln2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, s, mode, rank, alpha, seed, max_t, wdt):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        full = mode == "full"
        self.tied = s["tied"]
        self.wte = nn.Parameter(rand_weight((s["vocab"], s["d"]), wdt, 0.02, gen),
                                requires_grad=full)
        self.blocks = nn.ModuleList(Block(s, gen, mode, rank, alpha, wdt) for _ in range(s["layers"]))
        self.ln_f = RMSNorm(s["d"], trainable=full)
        if not self.tied:
            self.lm_head = nn.Parameter(rand_weight((s["vocab"], s["d"]), wdt, 0.02, gen),
                                        requires_grad=full)
        dh = s["d"] // s["heads"]
        inv = 1.0 / (s["theta"] ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh))
        ang = torch.outer(torch.arange(max_t, dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1)  # rotate-half layout: [T, D]
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)
        mask = torch.full((max_t, max_t), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def row_logps(self, idx, targets, completion):
        """Each row's summed log p(target) over its last `completion` targets."""
        logits = self.logits(idx)[:, -completion:].float()
        logp = torch.log_softmax(logits, dim=-1)
        return logp.gather(-1, targets[:, -completion:].unsqueeze(-1)).squeeze(-1).sum(-1)

    def forward(self, idx, targets):
        logits = self.logits(idx)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

    def logits(self, idx):
        t = idx.shape[1]
        x = F.embedding(idx, self.wte).float()  # fp32 residual stream
        cos, sin, mask = self.cos[:t], self.sin[:t], self.mask[:t, :t]
        for blk in self.blocks:
            x = blk(x, cos, sin, mask)
        head = self.wte if self.tied else self.lm_head
        return F.linear(self.ln_f(x), head)  # [B, T, V], bf16 under autocast


def probe():
    """GFLOP/s of a bf16 and an fp32 [256 x 1024] x [1024 x 1024] product.

    Debian's PyTorch 1.13 multiplies bf16 through oneDNN only on CPUs with
    AVX-512 (BW/VL/DQ); elsewhere (AVX2 only) it falls back to a reference loop
    at ~1 GFLOP/s, which would make a 1B bf16 step take tens of minutes.
    """
    a, b = torch.randn(256, 1024), torch.randn(1024, 1024)
    out = {}
    for name, (x, y) in {"fp32": (a, b), "bf16": (a.bfloat16(), b.bfloat16())}.items():
        x @ y
        n, t0 = 0, time.perf_counter()
        while n < 3 or time.perf_counter() - t0 < 0.3:
            x @ y
            n += 1
        out[name] = 2 * 256 * 1024 * 1024 * n / (time.perf_counter() - t0) / 1e9
    return out


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--layers", type=int, default=0, help="override the layer count (0 = shape's)")
    ap.add_argument("--mode", choices=["lora", "full"], default="lora")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                    help="compute: bf16 autocast, or fp32 (no autocast)")
    ap.add_argument("--base-dtype", choices=["auto", "bf16", "fp32"], default="auto",
                    help="storage of the frozen base (lora): auto = bf16 with --dtype bf16, "
                         "fp32 with --dtype fp32")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3, help="timed steps")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=2, help="0: torch's default")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--grad-clip", type=float, default=1.0, help="0 = off")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--objective", choices=["lm", "dpo"], default="lm",
                    help="lm: cross-entropy; dpo: DPO over pairs of rows (--batch even)")
    ap.add_argument("--completion", type=int, default=0,
                    help="dpo: completion tokens per row (0 = seq / 2)")
    ap.add_argument("--beta", type=float, default=0.1, help="dpo: beta")
    ap.add_argument("--probe", action="store_true",
                    help="print bf16 and fp32 GEMM GFLOP/s as JSON and exit")
    args = ap.parse_args()
    require_optimised_blas()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.probe:
        print(json.dumps({k: round(v, 2) for k, v in probe().items()}))
        return
    torch.manual_seed(args.seed)
    s = dict(SHAPES[args.shape])
    if args.layers > 0:
        s["layers"] = args.layers

    if args.mode == "full":
        wdt = torch.float32  # fp32 master weights, bf16 copies by autocast
    elif args.base_dtype == "auto":
        wdt = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    else:
        wdt = torch.bfloat16 if args.base_dtype == "bf16" else torch.float32
    t0 = time.perf_counter()
    with torch.no_grad():
        model = Llama(s, args.mode, args.rank, args.alpha, args.seed, args.seq, wdt)
    init_s = time.perf_counter() - t0
    params = [p for p in model.parameters() if p.requires_grad]
    n_total = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in params)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    # Unfused AdamW: 1.13 has no `fused`, and on the CPU runs the per-parameter loop.
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    g = torch.Generator().manual_seed(args.seed + 1)
    idx = torch.randint(0, s["vocab"], (args.batch, args.seq), generator=g)
    targets = torch.randint(0, s["vocab"], (args.batch, args.seq), generator=g)

    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    dpo = args.objective == "dpo"
    if dpo and args.batch % 2:
        sys.exit("--objective dpo needs an even --batch (pairs of rows)")
    completion = args.completion or args.seq // 2
    ref = None
    ref_s = 0.0
    if dpo and args.mode == "full":  # precomputed once, before training
        t0 = time.perf_counter()
        with torch.no_grad(), autocast():
            ref = model.row_logps(idx, targets, completion)
        ref_s = time.perf_counter() - t0

    def dpo_loss():
        if args.mode == "lora":  # the base: the adapters switched off
            LoRALinear.off = True
            with torch.no_grad(), autocast():
                r = model.row_logps(idx, targets, completion)
            LoRALinear.off = False
        else:
            r = ref
        with autocast():
            logp = model.row_logps(idx, targets, completion)
        z = (logp[0::2] - r[0::2]) - (logp[1::2] - r[1::2])
        return -F.logsigmoid(args.beta * z).mean()

    def step():
        if dpo:
            loss = dpo_loss()
        else:
            with autocast():
                loss = model(idx, targets)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    tokens = args.batch * args.seq
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.mode}, "
          f"objective {args.objective}{f' (reference precomputed in {ref_s:.1f} s)' if ref is not None else ''}, "
          f"{args.dtype} compute, {str(wdt)[6:]} weights, shape {args.shape} ({s['layers']} layers), B={args.batch} T={args.seq}, "
          f"{n_total / 1e6:.2f}M params, {n_train / 1e6:.2f}M trainable, "
          f"init {init_s:.1f} s, rss {peak_rss_bytes() / 2**20:.0f} MiB", flush=True)
    times, loss = timed_steps(step, args.warmup, args.steps, tokens)

    mean = sum(times) / len(times)
    rss = peak_rss_bytes()
    result = {
        "framework": "pytorch", "torch": torch.__version__, "mode": args.mode,
        "objective": args.objective, "reference_precompute_s": ref_s,
        "dtype": args.dtype, "weights": str(wdt)[6:], "shape": args.shape, "layers": s["layers"],
        "threads": torch.get_num_threads(), "batch": args.batch, "seq": args.seq,
        "rank": args.rank, "alpha": args.alpha, "params": n_total, "trainable": n_train,
        "init_s": init_s, "steps": args.steps, "step_ms_mean": mean * 1e3,
        "step_ms_min": min(times) * 1e3, "tokens_per_s": tokens / mean,
        "tokens_per_s_best": tokens / min(times), "peak_rss_bytes": rss, "final_loss": loss,
    }
    print(f"RESULT torch {args.mode}{' dpo' if dpo else ''}: tokens_per_s={tokens / mean:.1f} step_ms={mean * 1e3:.1f} "
          f"peak_rss_bytes={rss}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
