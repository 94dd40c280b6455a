#!/usr/bin/env bash
# Tensor and pipeline parallel against data parallel on this host: GPT-2
# 124M (vocabulary padded to 50304 so that tp divides it), bf16, 8 x 256
# tokens per step in micro-batches of 2 x 256, under mpirun -np 2 (one
# thread per rank): DP2, TP2, TP2 + SP and PP2 (1F1B, 4 micro-batches), plus
# one process (both cores) for reference. Prints each run's mean step time
# (steps after the first two), the data-parallel gradient wait and the
# pipeline's first-stage wait, and the activation workspace from the log.
# Usage: bash bench/run_tp_bench.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-6}
BIN=./build/bin/nekton
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
out=$(mktemp -d)
common=(--config configs/gpt2_124m.yaml model.vocab_size=50304 train.steps=$STEPS
        train.warmup_steps=2 train.micro_batch=2 train.global_batch=8)
run() {
  local name=$1
  shift
  echo "== $name"
  "$@" "${common[@]}" train.out_dir=$out/$name > $out/$name.log 2>&1 || { cat $out/$name.log; exit 1; }
  grep -E "activations|model parallel:|data parallel:" $out/$name.log | sed 's/^/   /'
  /usr/bin/python3 - "$out/$name/metrics.jsonl" "$name" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
ms = sum(r["step_ms"] for r in rows) / len(rows)
comm = [r.get("comm_ms") for r in rows if r.get("comm_ms") is not None]
c = f", gradient wait {sum(comm)/len(comm):.0f} ms" if comm else ""
pp = [r.get("pp_wait_ms") for r in rows if r.get("pp_wait_ms") is not None]
c += f", first stage waits {sum(pp)/len(pp):.0f} ms" if pp else ""
print(f"RESULT {sys.argv[2]}: {ms:.0f} ms/step, {2048/ms*1000:.0f} tokens/s{c}")
PY
}
run one $BIN train
run dp2 mpirun -np 2 $BIN train
run tp2 mpirun -np 2 $BIN train parallel.tp=2
run tp2_sp mpirun -np 2 $BIN train parallel.tp=2 parallel.sp=true
run pp2 mpirun -np 2 $BIN train parallel.pp=2
run pp2_9_3 mpirun -np 2 $BIN train parallel.pp=2 parallel.pp_layout=9,3
rm -rf "$out"
