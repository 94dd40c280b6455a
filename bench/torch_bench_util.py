"""The timing loop the PyTorch reference benchmarks share (torch_gpt2_bench.py,
torch_lora_bench.py): warm-up steps, then timed steps, each printed."""
import time


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
