#!/usr/bin/python3
"""Greedy KV-cache decoding in PyTorch 1.13 on the CPU: the reference for
bench/bench_generate.cc (same shapes, random weights, same thread count).

Self-contained GPT-2 (learned positions, LayerNorm, GELU) and Llama (RoPE,
RMSNorm, SwiGLU, grouped-query attention) with a preallocated [B, H, L, D]
cache per layer; all prompts are prefilled in one forward, then one token per
sequence per step. Prints one line and a JSON object like bench_generate.

  /usr/bin/python3 bench/torch_generate_bench.py --preset gpt2-124m --dtype f32 \
      --batch 1 --prompt 128 --new 128 --threads 2
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

PRESETS = {
    # layers, heads, kv heads, d_model, d_ff, vocab, llama
    "gpt2-124m": (12, 12, 12, 768, 3072, 50257, False),
    "llama-1b": (16, 32, 8, 2048, 8192, 128256, True),
}


def rope(x, pos, theta, D):
    # x [B, H, T, D], pos [T]: rotate-half convention.
    inv = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = pos.double()[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Model:
    def __init__(self, preset, dtype, max_len, batch):
        L, H, KV, C, FF, V, llama = PRESETS[preset]
        self.L, self.H, self.KV, self.C, self.V, self.llama = L, H, KV, C, V, llama
        self.D = C // H
        g = torch.Generator().manual_seed(1)
        w = lambda *s: (torch.randn(*s, generator=g) * 0.02).to(dtype)
        self.wte = w(V, C)
        self.wpe = None if llama else w(max_len, C)
        qkv = (H + 2 * KV) * self.D
        self.layers = []
        for _ in range(L):
            self.layers.append(dict(
                ln1=torch.ones(C, dtype=dtype), ln1b=torch.zeros(C, dtype=dtype),
                qkv=w(qkv, C), qkvb=None if llama else torch.zeros(qkv, dtype=dtype),
                proj=w(C, C), projb=None if llama else torch.zeros(C, dtype=dtype),
                ln2=torch.ones(C, dtype=dtype), ln2b=torch.zeros(C, dtype=dtype),
                up=w(2 * FF if llama else FF, C), upb=None if llama else torch.zeros(FF, dtype=dtype),
                down=w(C, FF), downb=None if llama else torch.zeros(C, dtype=dtype),
                k=torch.zeros(batch, KV, max_len, self.D, dtype=dtype),
                v=torch.zeros(batch, KV, max_len, self.D, dtype=dtype)))
        self.lnf, self.lnfb = torch.ones(C, dtype=dtype), torch.zeros(C, dtype=dtype)
        self.theta = 500000.0

    def norm(self, x, w, b):
        if self.llama:
            return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype) * w
        return F.layer_norm(x, (self.C,), w, b, 1e-5)

    def forward(self, tok, start):
        # tok [B, T] at positions start..start+T-1; returns last-position logits [B, V].
        B, T = tok.shape
        pos = torch.arange(start, start + T)
        x = self.wte[tok]
        if self.wpe is not None:
            x = x + self.wpe[pos]
        H, KV, D = self.H, self.KV, self.D
        for l in self.layers:
            h = self.norm(x, l["ln1"], l["ln1b"])
            qkv = F.linear(h, l["qkv"], l["qkvb"])
            q = qkv[..., : H * D].view(B, T, H, D).transpose(1, 2)
            k = qkv[..., H * D:(H + KV) * D].view(B, T, KV, D).transpose(1, 2)
            v = qkv[..., (H + KV) * D:].view(B, T, KV, D).transpose(1, 2)
            if self.llama:
                q, k = rope(q, pos, self.theta, D), rope(k, pos, self.theta, D)
            l["k"][:, :, start:start + T] = k
            l["v"][:, :, start:start + T] = v
            kk, vv = l["k"][:, :, : start + T], l["v"][:, :, : start + T]
            if KV != H:
                kk = kk.repeat_interleave(H // KV, 1)
                vv = vv.repeat_interleave(H // KV, 1)
            s = (q @ kk.transpose(-1, -2)) / math.sqrt(D)
            if T > 1:
                mask = torch.ones(T, start + T, dtype=torch.bool).tril(start)
                s = s.masked_fill(~mask, float("-inf"))
            a = (s.float().softmax(-1).to(x.dtype) @ vv).transpose(1, 2).reshape(B, T, H * D)
            x = x + F.linear(a, l["proj"], l["projb"])
            h = self.norm(x, l["ln2"], l["ln2b"])
            u = F.linear(h, l["up"], l["upb"])
            if self.llama:
                gate, up = u.chunk(2, -1)
                u = F.silu(gate) * up
            else:
                u = F.gelu(u, approximate="tanh")
            x = x + F.linear(u, l["down"], l["downb"])
        x = self.norm(x[:, -1], self.lnf, self.lnfb)
        return F.linear(x, self.wte).float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpt2-124m", choices=sorted(PRESETS))
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dtype = torch.float32 if a.dtype == "f32" else torch.bfloat16
    m = Model(a.preset, dtype, a.prompt + a.new, a.batch)
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, m.V, (a.batch, a.prompt), generator=g)
    best = None
    with torch.inference_mode():
        for rep in range(a.reps + 1):  # rep 0 warms up
            t0 = time.perf_counter()
            nxt = m.forward(prompt, 0).argmax(-1, keepdim=True)
            t1 = time.perf_counter()
            for i in range(1, a.new):
                nxt = m.forward(nxt, a.prompt + i - 1).argmax(-1, keepdim=True)
            t2 = time.perf_counter()
            if rep == 0 and a.reps > 0:
                continue
            r = (t2 - t0, t1 - t0, (t2 - t1) / max(1, a.new - 1))
            if best is None or r[0] < best[0]:
                best = r
    total, prefill, decode = best
    tps, dtps = a.batch * a.new / total, a.batch / decode
    print(f"torch {a.preset} {a.dtype} threads={a.threads} batch={a.batch} prompt={a.prompt} "
          f"new={a.new}: prefill {prefill:.3f} s, decode {1e3 * decode:.2f} ms/step, "
          f"{tps:.1f} tokens/s overall, {dtps:.1f} tokens/s decoding")
    print(json.dumps(dict(impl="torch", preset=a.preset, dtype=a.dtype, batch=a.batch,
                          prompt=a.prompt, new=a.new, prefill_s=round(prefill, 4),
                          decode_ms=round(1e3 * decode, 3), tokens_per_s=round(tps, 2),
                          decode_tokens_per_s=round(dtps, 2))))


if __name__ == "__main__":
    main()
