#!/usr/bin/env bash
# Batch-1 decode and prompt processing of the Llama 3.2 1B shape (random
# weights, bytes tokenizer) from GGUF files, Nekton at each CPU ISA level
# (NK_CPU_ISA) against llama.cpp's own llama-bench built natively on this
# machine (cmake -DGGML_NATIVE=ON -DLLAMA_CURL=OFF, target llama-bench), the
# same files, the same threads; the engines alternate, every run printed.
# Usage: bash bench/run_decode_isa_bench.sh LLAMA_BENCH [threads] [types] [levels] [runs] [dir]
#   e.g. bash bench/run_decode_isa_bench.sh /work/llama.cpp-build/build/bin/llama-bench 2 \
#        "f16 q8_0 q4_k_m" "avx2 avx512 avx512_bf16" 2
# Nekton: build/bin/bench_generate FILE DTYPE 1 P N (f16 weights kept at 2
# bytes as bf16 compute, bf16 weights loaded dense in bf16, the rest f32
# compute over their quantised blocks);
# llama.cpp: llama-bench -p P -n N (pp and tg from an empty context).
set -euo pipefail
cd "$(dirname "$0")/.."
LB=$1
TH=${2:-2}
TYPES=${3:-"f16 q8_0 q4_k_m"}
LEVELS=${4:-"avx2 avx512 avx512_bf16"}
RUNS=${5:-2}
DIR=${6:-/tmp/nk_decode_isa}
P=${P:-64}
N=${N:-32}
export OMP_NUM_THREADS=$TH
mkdir -p "$DIR"
[ -f "$DIR/llama1b/model.safetensors" ] || ./build/bin/save_random_model llama-1b "$DIR/llama1b" bytes
field() { grep -o "\"$1\": [0-9.]*" | tail -1 | grep -o '[0-9.]*$'; }
for t in $TYPES; do
  f=$DIR/llama1b-$t.gguf
  [ -f "$f" ] || ./build/bin/nekton quantize "$DIR/llama1b" "$f" --type "$t" > /dev/null
  dt=f32
  [ "$t" = f16 ] || [ "$t" = bf16 ] && dt=bf16
  echo "== $t ($(du -h "$f" | cut -f1)), $TH threads, prompt $P, new $N"
  for r in $(seq "$RUNS"); do
    line="run $r:"
    for lvl in $LEVELS; do
      js=$(NK_CPU_ISA=$lvl ./build/bin/bench_generate "$f" $dt 1 "$P" "$N" 1 2>/dev/null | tail -1)
      line+=" nekton[$lvl] tg $(echo "$js" | field decode_tokens_per_s) pp $(echo "$js" | field prompt_tokens_per_s);"
    done
    lc=$("$LB" -m "$f" -t "$TH" -p "$P" -n "$N" -r 1 -o jsonl 2>/dev/null)
    line+=" llama.cpp tg $(echo "$lc" | tail -1 | field avg_ts) pp $(echo "$lc" | head -1 | field avg_ts)"
    echo "$line (load $(cut -d' ' -f1 /proc/loadavg))"
  done
done
