#!/usr/bin/env bash
# Greedy KV-cache generation: Nekton (bench_generate) and PyTorch
# (bench/torch_generate_bench.py) side by side, same shapes and threads.
# Usage: bash bench/run_generate_bench.sh [threads] [llama_new_tokens] [llama_batches]
# On a shared machine every parallel region waits for all its threads to be
# scheduled; threads=1 gives the steadiest figures there.
set -euo pipefail
cd "$(dirname "$0")/.."
TH=${1:-$(nproc)}
LNEW=${2:-8}
LBATCH=${3:-"1 8"}
export OMP_NUM_THREADS=$TH
B=./build/bin/bench_generate
PT="/usr/bin/python3 bench/torch_generate_bench.py --threads $TH"
for dt in f32 bf16; do
  for bs in 1 8; do
    $B gpt2-124m $dt $bs 128 128 1 | sed -n 1p
    $PT --preset gpt2-124m --dtype $dt --batch $bs --prompt 128 --new 128 --reps 1 | sed -n 1p
  done
done
# Decode cost against prompt length (batch 1): only attention over the cache grows.
for p in 32 512; do
  $B gpt2-124m f32 1 $p 32 1 | sed -n 1p
  $PT --preset gpt2-124m --dtype f32 --batch 1 --prompt $p --new 32 --reps 1 | sed -n 1p
done
# llama-1b: short runs (2 cores), one timed run each.
for dt in f32 bf16; do
  for bs in $LBATCH; do
    $B llama-1b $dt $bs 128 "$LNEW" 0 | sed -n 1p
    $PT --preset llama-1b --dtype $dt --batch $bs --prompt 128 --new "$LNEW" --reps 0 | sed -n 1p
  done
done
