"""What the PyTorch reference benchmarks share (torch_gpt2_bench.py,
torch_lora_bench.py): the check that PyTorch runs on an optimised BLAS, and
the timing loop (warm-up steps, then timed steps, each printed)."""
import sys
import time


def require_optimised_blas():
    """Exits with a message unless the BLAS this process loaded (with torch,
    imported by the caller) is an optimised one. Debian's python3-torch takes
    whichever libblas.so.3 the alternatives point at: without
    libopenblas0-pthread that is the reference BLAS, on which an fp32 GPT-2
    step takes minutes, and a comparison against it means nothing."""
    loaded = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) > 5 and any(k in fields[-1].lower() for k in ("blas", "blis", "mkl")):
                loaded.add(fields[-1])
    if any(k in p.lower() for p in loaded for k in ("openblas", "blis", "mkl")):
        return
    sys.exit(f"PyTorch loaded no optimised BLAS ({', '.join(sorted(loaded)) or 'none'}): "
             "install libopenblas0-pthread (apt-get install libopenblas0-pthread) and run again")


def timed_steps(step, warmup, steps, tokens):
    """Runs step() (which returns the loss) `warmup` times, then `steps`
    times; returns the timed steps' seconds and the last loss. `tokens` per
    step, for the printed rate."""
    for i in range(warmup):
        t0 = time.perf_counter()
        loss = step()
        print(f"warmup {i}: {time.perf_counter() - t0:.2f} s, loss {loss:.4f}", flush=True)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
        print(f"step {i}: {times[-1]:.2f} s, {tokens / times[-1]:.0f} tok/s, loss {loss:.4f}",
              flush=True)
    return times, loss
