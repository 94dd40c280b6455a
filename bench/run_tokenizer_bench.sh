#!/usr/bin/env bash
# Nekton's BPE encode vs tiktoken (WASM, in Node), one thread each, same corpus.
#   bench/run_tokenizer_bench.sh [build-dir] [reps]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build}"
reps="${2:-5}"
corpus="$(mktemp -t nk_tok_corpus.XXXXXX)"
trap 'rm -f "$corpus"' EXIT
names=(gpt2 cl100k_base o200k_base)
ours="$(taskset -c 0 "$build/bin/bench_tokenizer" --corpus-out "$corpus" --reps "$reps" "${names[@]}")"
ref="$(taskset -c 0 node "$here/tiktoken_bench.js" "$corpus" "$reps" "${names[@]}")"
echo "$ours"
echo "$ref"
python3 - "$ours" "$ref" <<'PY'
import json, sys
ours = {j["encoding"]: j for j in map(json.loads, sys.argv[1].splitlines())}
ref = {j["encoding"]: j for j in map(json.loads, sys.argv[2].splitlines())}
for name in ours:
    o, r = ours[name], ref[name]
    same = "same" if o["tokens"] == r["tokens"] else "DIFFERENT"
    print(f'{name:12s} warm: nekton {o["MB_per_s"]:6.2f} MB/s  tiktoken {r["MB_per_s"]:6.2f} MB/s'
          f'  ratio {o["MB_per_s"] / r["MB_per_s"]:5.2f}x | first pass: nekton'
          f' {o["cold_MB_per_s"]:6.2f}  tiktoken {r["cold_MB_per_s"]:6.2f}'
          f'  ratio {o["cold_MB_per_s"] / r["cold_MB_per_s"]:5.2f}x  (token count {same}: {o["tokens"]})')
PY
