#!/usr/bin/env bash
# Quantised inference, Nekton against llama.cpp on the same GGUF files of the
# Llama 3.2 1B shape (random weights, bytes tokenizer), side by side:
#   prompt processing tokens/s and batch-1 decode tokens/s, then aggregate
#   tokens/s with S sequences at once (Nekton: the Generator, the server's
#   engine; llama.cpp: one context of S sequences, batched per step).
# llama.cpp is node-llama-cpp's prebuilt CPU build (scripts/fetch_assets.sh --test).
# Usage: bash bench/run_quant_bench.sh [threads] [types] [parallel] [dir]
#   e.g. bash bench/run_quant_bench.sh 2 "f16 q8_0 q4_0 q4_k_m" "4 16 64" /tmp/qb
# The GGUF files are made once in DIR (save_random_model + nekton quantize).
set -euo pipefail
cd "$(dirname "$0")/.."
TH=${1:-$(nproc)}
TYPES=${2:-"f16 q8_0 q4_0 q4_k_m"}
PAR=${3:-"4 16 64"}
DIR=${4:-/tmp/nk_quant_bench}
P=${P:-64}    # prompt tokens (pp and batch 1)
N=${N:-32}    # generated tokens
PS=${PS:-16}  # prompt tokens per sequence in the parallel runs
export OMP_NUM_THREADS=$TH
mkdir -p "$DIR"
if [ ! -f "$DIR/llama1b/model.safetensors" ]; then
  ./build/bin/save_random_model llama-1b "$DIR/llama1b" bytes
fi
MODULES=$PWD/assets/llama-cpp/node_modules
for t in $TYPES; do
  f=$DIR/llama1b-$t.gguf
  [ -f "$f" ] || ./build/bin/nekton quantize "$DIR/llama1b" "$f" --type "$t" > /dev/null
  echo "== $t ($(du -h "$f" | cut -f1))"
  # f16 weights are read into the compute dtype: bf16 keeps them at 2 bytes.
  dts="f32"
  [ "$t" = f16 ] && dts="f32 bf16"
  for dt in $dts; do
    ./build/bin/bench_generate "$f" $dt 1 "$P" "$N" 1 | sed -n 2p
  done
  node bench/llama_cpp_bench.mjs "$MODULES" "$f" "$TH" "$P" "$N" | sed -n 1p
  for s in $PAR; do
    ./build/bin/bench_generate "$f" f32 "$s" "$PS" "$N" 0 | sed -n 2p
  done
  node bench/llama_cpp_bench.mjs "$MODULES" "$f" "$TH" "$PS" "$N" "$(echo $PAR | tr ' ' ,)" |
    sed -n '2,$p'
done
