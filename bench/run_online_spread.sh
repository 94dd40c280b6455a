#!/usr/bin/env bash
# The run-to-run spread of tests/align/online_learning.sh: the test's whole
# chain (format-only SFT, then GRPO or PPO, then the held-out exact match)
# at each CPU ISA level (NK_CPU_ISA) and for each seed (train.seed and
# align.seed of the RL run; "default" runs the test as ctest does; S/R sets
# the format-only SFT run's train.seed to S and the RL run's seeds to R,
# either of them "default"). One line per run: level, seed, accuracy before
# and after, the gain.
#   bench/run_online_spread.sh [MODE] [LEVELS] [SEEDS] [KEY=VALUE...]
#   bench/run_online_spread.sh lora "avx2 avx512 avx512_bf16" "default 1 2 3"
#   bench/run_online_spread.sh lora avx2 "default/default 1/default 2/1"
# KEY=VALUEs go to the RL run after the test's own (e.g. train.steps=200).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$REPO/build}
MODE=${1:-lora}
LEVELS=${2:-avx2 avx512 avx512_bf16}
SEEDS=${3:-default 1 2 3}
EXTRA=("${@:4}")
# As ctest runs it: two 2-thread OpenMP processes that spin starve each other.
export OMP_WAIT_POLICY=PASSIVE
printf '%-12s %-8s %7s %7s %7s\n' level seed before after gain
for level in $LEVELS; do
  for seed in $SEEDS; do
    keys=("${EXTRA[@]}")
    sft=default rl=$seed
    [[ $seed == */* ]] && sft=${seed%/*} rl=${seed#*/}
    [[ $sft == default ]] || keys+=("sft:train.seed=$sft")
    [[ $rl == default ]] || keys+=("train.seed=$rl" "align.seed=$rl")
    line=$(NK_CPU_ISA=$level bash "$REPO/tests/align/online_learning.sh" "$REPO" "$BUILD" "$MODE" \
      "${keys[@]}" 2>&1 | grep "held-out accuracy" || true)
    # "held-out accuracy: format-only SFT B, after METHOD A"
    read -r before after < <(sed -E 's/.*SFT ([0-9.]+), after [^ ]+ ([0-9.]+).*/\1 \2/' <<<"$line")
    if [[ -z $line ]]; then
      printf '%-12s %-8s %7s\n' "$level" "$seed" "(run failed)"
      continue
    fi
    printf '%-12s %-8s %7s %7s %+7.2f\n' "$level" "$seed" "$before" "$after" \
      "$(/usr/bin/python3 -c "print($after - $before)")"
  done
done
