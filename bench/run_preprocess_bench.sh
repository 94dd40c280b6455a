#!/usr/bin/env bash
# `nekton preprocess` throughput, end to end (read, parse, tokenize, write
# .bin/.idx): a JSONL corpus of GCIDE dictionary paragraphs (each paragraph a
# document, the dictionary repeated to reach ~120 MB), plain and zstd, with 1
# worker and with every core, for the byte tokenizer and for "gpt2" when this
# build can load it.
# Usage: bash bench/run_preprocess_bench.sh [copies of GCIDE, default 3]
set -euo pipefail
cd "$(dirname "$0")/.."
COPIES=${1:-3}
BIN=./build/bin/nekton
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

zcat /usr/share/dictd/gcide.dict.dz | /usr/bin/python3 -c '
import json, re, sys
text = sys.stdin.buffer.read().decode("utf-8", "replace")  # a few stray Latin-1 bytes
paras = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for c in range(int(sys.argv[2])):
        for i, p in enumerate(paras):
            f.write(json.dumps({"id": f"{c}-{i}", "text": p}, ensure_ascii=False) + "\n")
' "$out/gcide.jsonl" "$COPIES"
zstd -q -3 -T0 "$out/gcide.jsonl" -o "$out/gcide.jsonl.zst"
mb() { echo "$(($(wc -c <"$1") / 1000000)) MB"; }
echo "corpus: $(wc -l <"$out/gcide.jsonl") documents, $(mb "$out/gcide.jsonl") plain," \
  "$(mb "$out/gcide.jsonl.zst") zstd"

toks=(bytes)
printf '{"text": "probe"}\n' >"$out/probe.jsonl"
if $BIN preprocess preprocess.input="$out/probe.jsonl" preprocess.output_prefix="$out/probe" \
  preprocess.tokenizer=gpt2 preprocess.progress=none >/dev/null 2>&1; then
  toks+=(gpt2)
else
  echo "(gpt2 tokenizer not available in this build: bytes only)"
fi

for tok in "${toks[@]}"; do
  for input in gcide.jsonl gcide.jsonl.zst; do
    for w in 1 "$(nproc)"; do
      echo "== tokenizer=$tok input=$input workers=$w"
      $BIN preprocess preprocess.input="$out/$input" preprocess.output_prefix="$out/ds" \
        preprocess.tokenizer="$tok" preprocess.workers="$w" preprocess.progress=none | sed 's/^/  /'
      rm -f "$out/ds.bin" "$out/ds.idx"
    done
  done
done
if [[ " ${toks[*]} " == *" gpt2 "* ]]; then
  echo "== reference: tiktoken (WASM, Node) parse + encode, gcide.jsonl, 1 thread"
  node bench/tiktoken_preprocess.js "$out/gcide.jsonl" gpt2 | sed 's/^/  /'
fi
