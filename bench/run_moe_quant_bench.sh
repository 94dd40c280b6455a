#!/usr/bin/env bash
# Batch-1 decode of a quantised Mixture-of-Experts model, Nekton against
# llama.cpp's own llama-bench on the same GGUF file. The model is
# Mixtral-shaped and small enough for a laptop-class CPU (8 layers, 1024
# wide, 16/4 heads, 8 experts of 1024 units, top-2, 32000 vocabulary:
# 288M parameters, of which a token reads 104M: attention, the router, 2 of
# the 8 experts of each layer and the output head),
# random weights, bytes tokenizer, written once by save_random_model and
# `nekton quantize`.
# Usage: bash bench/run_moe_quant_bench.sh LLAMA_BENCH [threads] [types] [runs] [dir]
#   e.g. bash bench/run_moe_quant_bench.sh /work/llama.cpp-build/build/bin/llama-bench 2 "q4_k_m q4_k" 5
# LLAMA_BENCH: llama.cpp's llama-bench, built natively (cmake -DGGML_NATIVE=ON
# -DLLAMA_CURL=OFF, target llama-bench). Nekton: build/bin/bench_generate
# (the Generator the server runs; prompt of 1 token, then N steps timed);
# llama.cpp: llama-bench -p 0 -n N (tg: N tokens from an empty context).
# Each engine runs RUNS times, alternating; every run is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
LB=$1
TH=${2:-2}
TYPES=${3:-"q4_k_m"}
RUNS=${4:-5}
DIR=${5:-/tmp/nk_moe_bench}
N=${N:-32}
export OMP_NUM_THREADS=$TH
mkdir -p "$DIR"
if [ ! -f "$DIR/model/model.safetensors" ]; then
  ./build/bin/save_random_model mixtral-tiny "$DIR/model" bytes n_layer=8 d_model=1024 \
    n_head=16 n_kv_head=4 d_ff=1024 moe.moe_d_ff=1024 moe.num_experts=8 vocab_size=32000 \
    max_seq_len=512
fi
for t in $TYPES; do
  f=$DIR/mixtral-$t.gguf
  [ -f "$f" ] || ./build/bin/nekton quantize "$DIR/model" "$f" --type "$t" > /dev/null
  echo "== $t ($(du -h "$f" | cut -f1)), $TH threads, load: $(cut -d' ' -f1-3 /proc/loadavg)"
  for r in $(seq "$RUNS"); do
    nk=$(./build/bin/bench_generate "$f" f32 1 1 $((N + 1)) 1 | tail -1 |
      grep -o '"decode_tokens_per_s": [0-9.]*' | grep -o '[0-9.]*$')
    lc=$("$LB" -m "$f" -t "$TH" -p 0 -n "$N" -r 1 -o jsonl 2>/dev/null | tail -1 |
      grep -o '"avg_ts": [0-9.]*' | grep -o '[0-9.]*$')
    echo "run $r: nekton $nk tok/s, llama.cpp $lc tok/s (load $(cut -d' ' -f1 /proc/loadavg))"
  done
done
