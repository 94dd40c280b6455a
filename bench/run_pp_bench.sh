#!/usr/bin/env bash
# Pipeline bubble of the 1F1B schedule, plain and interleaved (vp = 2), on
# this host: a GPT-2-shaped model of 8 layers (d_model 256, byte vocabulary)
# in 2 stages under mpirun -np 2, one thread per rank, micro-batches of
# 1 x 256 tokens, m = 4, 8 and 16 micro-batches per step. The first stage's
# time waiting on its neighbour (metrics.jsonl pp_wait_ms: the bubble plus
# unoverlapped transfers) over its busy time is set against Megatron's
# (p - 1) / (v m).
# Usage: bash bench/run_pp_bench.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-5}
BIN=./build/bin/nekton
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
out=$(mktemp -d)
for vp in 1 2; do
for m in 4 8 16; do
  mpirun -np 2 $BIN train model.preset=gpt-tiny model.n_layer=8 model.d_model=256 \
    model.n_head=8 model.d_ff=1024 model.vocab_size=264 data.path=README.md train.dtype=f32 \
    train.micro_batch=1 train.seq_len=256 train.global_batch=$m train.steps=$STEPS \
    train.warmup_steps=1 train.val_every=0 train.threads=1 parallel.pp=2 parallel.vp=$vp \
    train.out_dir=$out/v$vp-m$m > $out/m$m.log 2>&1 || { cat $out/m$m.log; exit 1; }
  /usr/bin/python3 - "$out/v$vp-m$m/metrics.jsonl" "$m" "$vp" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
m, p, v = int(sys.argv[2]), 2, int(sys.argv[3])
step = sorted(r["step_ms"] for r in rows)[len(rows) // 2]
wait = sorted(r["pp_wait_ms"] for r in rows)[len(rows) // 2]
print(f"RESULT 1F1B p={p} v={v} m={m}: step {step:.0f} ms, first stage waits {wait:.0f} ms: "
      f"bubble {wait / (step - wait):.3f} of busy time, (p-1)/(v m) = {(p - 1) / (v * m):.3f}")
PY
done
done
rm -rf "$out"
