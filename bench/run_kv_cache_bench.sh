#!/usr/bin/env bash
# Batch-1 decode deep into a context, per KV cache dtype: the Llama 3.2 1B
# shape (random weights, bytes tokenizer) from one GGUF file, Nekton's
# bench_generate (a prompt of DEPTH tokens, then NEW decoded, after a
# warm-up run of a 64-token prompt; kv_cache_dtype) against llama.cpp's own
# llama-bench built natively on this machine (cmake -DGGML_NATIVE=ON
# -DLLAMA_CURL=OFF, target llama-bench) at the same depth (-d DEPTH -p 0
# -n NEW, flash attention on: llama.cpp quantises the V cache only under
# it), the same file, the same threads; the engines alternate, every run
# printed. Each cache dtype is a pair: Nekton's name, llama.cpp's -ctk/-ctv.
# Usage: bash bench/run_kv_cache_bench.sh LLAMA_BENCH [threads] [depths] [runs] [type] [dir]
#   e.g. bash bench/run_kv_cache_bench.sh /work/llama.cpp-build/build/bin/llama-bench 2 "1024 4096" 2
set -euo pipefail
cd "$(dirname "$0")/.."
LB=$1
TH=${2:-2}
DEPTHS=${3:-"1024 4096"}
RUNS=${4:-2}
TYPE=${5:-q4_k_m}
DIR=${6:-/tmp/nk_kv_bench}
N=${N:-32}
CACHES=${CACHES:-"f16:f16 q8_0:q8_0"}
export OMP_NUM_THREADS=$TH
mkdir -p "$DIR"
[ -f "$DIR/llama1b/model.safetensors" ] || ./build/bin/save_random_model llama-1b "$DIR/llama1b" bytes
f=$DIR/llama1b-$TYPE.gguf
[ -f "$f" ] || ./build/bin/nekton quantize "$DIR/llama1b" "$f" --type "$TYPE" > /dev/null
field() { grep -o "\"$1\": [0-9.]*" | tail -1 | grep -o '[0-9.]*$'; }
for d in $DEPTHS; do
  echo "== $TYPE ($(du -h "$f" | cut -f1)), $TH threads, depth $d, new $N"
  for r in $(seq "$RUNS"); do
    line="run $r:"
    for c in $CACHES; do
      nk=${c%%:*}
      lc=${c##*:}
      js=$(BENCH_WARMUP_PROMPT=64 ./build/bin/bench_generate "$f" f32 1 "$d" "$N" 1 0 kv_cache_dtype="$nk" 2>/dev/null | tail -1)
      line+=" nekton[$nk] tg $(echo "$js" | field decode_tokens_per_s);"
      out=$("$LB" -m "$f" -t "$TH" -p 0 -n "$N" -d "$d" -fa 1 -ctk "$lc" -ctv "$lc" -r 1 -o jsonl 2>/dev/null)
      line+=" llama.cpp[$lc] tg $(echo "$out" | tail -1 | field avg_ts);"
    done
    echo "$line (load $(cut -d' ' -f1 /proc/loadavg))"
  done
done
