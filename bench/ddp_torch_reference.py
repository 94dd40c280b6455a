"""PyTorch DDP (gloo) reference for bench/run_ddp_bench.sh: the same GPT-2
shape, batch and threads as the Nekton runs, trained with AdamW in f32 by
WORLD processes on this host. Prints the median step time over steps 3..N
(milliseconds) of rank 0, and its peak RSS (MiB).

    /usr/bin/python3 bench/ddp_torch_reference.py WORLD STEPS [SHAPE [OPT]]

SHAPE: small (the default, below) or gpt2-124m (12 layers, d_model 768,
vocabulary 50257); OPT: adamw (the default) or zero1 (torch's
ZeroRedundancyOptimizer over AdamW: the optimizer state sharded over the
ranks). Debian's torch 1.13 has no ZeRO-2 on CPUs (its FSDP does not import
under Python 3.11).
"""
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

L, D, H, FF, V, T, B, GLOBAL = 6, 512, 8, 2048, 512, 128, 2, 8
if len(sys.argv) > 3 and sys.argv[3] == "gpt2-124m":
    L, D, H, FF, V = 12, 768, 12, 3072, 50257


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc, self.out = nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
        a = F.softmax((q @ k.transpose(-1, -2)) / (D // H) ** 0.5 +
                      torch.full((t, t), float("-inf")).triu(1), dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(D)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.ln_f(x) @ self.wte.weight.t()  # tied head


def worker(rank, world, steps, zero1):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29611")
    torch.set_num_threads(1)  # as train.threads=1 for each Nekton rank
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Gpt(), bucket_cap_mb=25)
    kw = dict(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    if zero1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **kw)
    else:
        opt = torch.optim.AdamW(model.parameters(), **kw)
    accum = GLOBAL // (B * world)
    g = torch.Generator().manual_seed(rank)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for m in range(accum):
            x = torch.randint(0, V, (B, T + 1), generator=g)
            if m < accum - 1:
                with model.no_sync():  # accumulate; only the last micro-batch communicates
                    F.cross_entropy(model(x[:, :-1]).view(-1, V), x[:, 1:].reshape(-1)).div(accum).backward()
            else:
                F.cross_entropy(model(x[:, :-1]).view(-1, V), x[:, 1:].reshape(-1)).div(accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print("torch_ddp%d%s %.0f ms, peak RSS %.0f MiB" %
              (world, " zero1" if zero1 else "", 1e3 * statistics.median(times[2:]), rss))
    dist.destroy_process_group()


if __name__ == "__main__":
    world, steps = int(sys.argv[1]), int(sys.argv[2])
    if world == 1:
        os.environ["MASTER_PORT"] = "29612"
    zero1 = len(sys.argv) > 4 and sys.argv[4] == "zero1"
    mp.spawn(worker, args=(world, steps, zero1), nprocs=world)
