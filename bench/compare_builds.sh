#!/usr/bin/env bash
# Two builds of Nekton side by side (a refactoring must not slow anything):
# GPT-2 124M training tokens/s (batch 8 x 256, f32 and bf16, the mean of steps
# 3..N) and greedy KV-cache decode ms/step (gpt2-124m, batch 1 and 8, 1 thread),
# run interleaved A B A B so that drifting load on a shared machine hits both.
# Each ROOT is a source tree with its build in ROOT/build.
# Usage: bash bench/compare_builds.sh OLD_ROOT NEW_ROOT [rounds] [train_steps]
set -euo pipefail
OLD=$(cd "$1" && pwd)
NEW=$(cd "$2" && pwd)
ROUNDS=${3:-2}
STEPS=${4:-6}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
train() {  # ROOT LABEL DTYPE
  local root=$1 label=$2 dt=$3
  (cd "$root" && ./build/bin/nekton train --config configs/gpt2_124m.yaml train.dtype="$dt" \
    train.steps="$STEPS" train.warmup_steps=2 train.peak_tflops=1 train.threads=2 \
    train.out_dir="$out/$label-$dt" >/dev/null 2>&1)
  /usr/bin/python3 - "$out/$label-$dt/metrics.jsonl" "$label" "$dt" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
print(f"train {sys.argv[2]} {sys.argv[3]}: {sum(r['tokens_per_s'] for r in rows) / len(rows):.1f} tokens/s")
PY
  rm -rf "$out/$label-$dt"
}
decode() {  # ROOT LABEL DTYPE BATCH
  local line
  line=$(OMP_NUM_THREADS=1 "$1/build/bin/bench_generate" gpt2-124m "$3" "$4" 128 64 1 | sed -n 1p)
  echo "decode $2 $3 batch $4: $line"
}
for r in $(seq "$ROUNDS"); do
  echo "== round $r"
  for dt in f32 bf16; do
    train "$OLD" old $dt
    train "$NEW" new $dt
  done
  for bs in 1 8; do
    decode "$OLD" old f32 $bs
    decode "$NEW" new f32 $bs
  done
done
