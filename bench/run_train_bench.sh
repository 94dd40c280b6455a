#!/usr/bin/env bash
# Training throughput of GPT-2 124M at batch 8 x 256, bf16 and fp32, Nekton
# and PyTorch (bench/torch_gpt2_bench.py) side by side in one session.
# Usage: bash bench/run_train_bench.sh [nekton_steps] [torch_steps]
set -euo pipefail
cd "$(dirname "$0")/.."
NK_STEPS=${1:-8}
PT_STEPS=${2:-4}
BIN=./build/bin/nekton
out=$(mktemp -d)
for dt in bf16 f32; do
  echo "== nekton $dt"
  $BIN train --config configs/gpt2_124m.yaml train.dtype=$dt train.steps=$NK_STEPS \
    train.out_dir=$out/$dt train.warmup_steps=2 | tail -n 3
  # Mean over steps after the first two (primitive creation, page faults).
  /usr/bin/python3 - "$out/$dt/metrics.jsonl" "$dt" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
tps = sum(r["tokens_per_s"] for r in rows) / len(rows)
mfu = sum(r["mfu"] for r in rows) / len(rows)
print(f"RESULT nekton {sys.argv[2]}: {tps:.0f} tokens/s, MFU {100*mfu:.1f}% (vs measured GEMM peak), "
      f"peak tensors {rows[-1]['peak_mem_bytes']/2**20:.0f} MiB, rss {rows[-1]['peak_rss_bytes']/2**20:.0f} MiB")
PY
done
for dt in bf16 fp32; do
  echo "== torch $dt"
  /usr/bin/python3 bench/torch_gpt2_bench.py --dtype $dt --steps $PT_STEPS --warmup 1 --threads "$(nproc)" | tail -n 2
done
rm -rf "$out"
