#!/usr/bin/env bash
# Uneven pipeline stages (parallel.pp_layout) on this host: a recipe on 2
# ranks at pp 2, each split of its layers in turn (an empty one: even; with
# parallel.vp=V among the keys, pp x V counts each), in rounds (the order
# the same every round), one thread a rank; prints each run's steps after the
# second and, per split, the median of every round's steps. A timing, not a
# test: run it on an idle machine. `nekton autoconfig` predicts the same
# splits (its table names the split after pp, e.g. "pp2 [8,4]").
#   bench/run_pp_split_bench.sh [BUILD] [ROUNDS] [STEPS] [SPLITS...] [-- KEY=VALUE...]
# Default: GPT-2 124M (configs/gpt2_124m.yaml, bf16, 8 x 256, micro-batch
# 2), splits 6,6 7,5 8,4 9,3 10,2, 2 rounds of 6 steps.
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-2}
STEPS=${3:-6}
shift $(($# < 3 ? $# : 3))
SPLITS=()
while (($#)) && [[ $1 != -- ]]; do SPLITS+=("$1"); shift; done
(($#)) && shift
RECIPE=("$@")
((${#SPLITS[@]})) || SPLITS=(6,6 7,5 8,4 9,3 10,2)
((${#RECIPE[@]})) || RECIPE=(--config configs/gpt2_124m.yaml train.micro_batch=2)
NK=$BUILD/bin/nekton
WORK=$(mktemp -d /tmp/nk_pp_split.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for ((r = 1; r <= ROUNDS; ++r)); do
  for s in "${SPLITS[@]}"; do
    "$NK" train --nproc 2 "${RECIPE[@]}" parallel.pp=2 parallel.pp_layout="$s" \
      train.steps="$STEPS" train.save_final=false train.threads=1 train.out_dir="$WORK/run" \
      >"$WORK/log" 2>&1 || { tail -n 20 "$WORK/log"; exit 1; }
    steps=$(/usr/bin/python3 -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
print(' '.join(f'{r[\"step_ms\"]:.0f}' for r in rows))" "$WORK/run/metrics.jsonl")
    echo "round $r split ${s:-even}: $steps" | tee -a "$WORK/all"
    rm -rf "$WORK/run"
  done
done
/usr/bin/python3 - "$WORK/all" <<'PY'
import statistics, sys
by = {}
for line in open(sys.argv[1]):
    head, steps = line.split(":")
    by.setdefault(head.split()[-1], []).extend(float(x) for x in steps.split())
print("| split | median step ms | steps |\n|---|---:|---:|")
for s, v in by.items():
    print(f"| {s} | {statistics.median(v):.0f} | {len(v)} |")
PY
