#!/usr/bin/env bash
# `nekton curate` across ranks (issue 15, item 2): the same pipeline run
# alone, under mpirun with 2 ranks and with 4 (oversubscribed) must write the
# same bytes: data/ and removed/ shards, and report.json apart from timings
# and spill sizes. The corpus plants exact and near duplicates across shards
# that land on different ranks. A rank SIGKILLed mid-run ends the job
# non-zero; the rerun resumes and gives the same bytes again. Incremental
# dedup (a crawl against an earlier crawl's saved state) gives the same output
# and the same new state alone and on 2 and 4 ranks.
#
# usage: curate_ranks.sh REPO BUILD
set -euo pipefail

REPO=$1
BUILD=$2
NEKTON=$BUILD/bin/nekton
NAME=curate_ranks
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
JOB_LIMIT_S=$((120 * ${NK_TIME_SCALE:-1}))

# shellcheck source=script_lib.sh
source "$(dirname "$0")/script_lib.sh"
[[ -x $NEKTON ]] || fail "no executable $NEKTON"
command -v mpirun >/dev/null || fail "mpirun is not on PATH"

# 9 shards of 600 documents: 400 base texts of 120 words from a 3000-word
# vocabulary; each document is a copy of a base (20%), a base with 3 words
# changed (30%), or text of its own. Bases are shared by all shards, so
# duplicates cross shards and ranks.
mkdir -p "$WORK/in"
awk -v dir="$WORK/in" 'BEGIN {
  srand(7)
  for (b = 0; b < 400; b++) {
    t = ""
    for (w = 0; w < 120; w++) t = t (w ? " " : "") "w" int(rand() * 3000)
    base[b] = t
  }
  for (s = 0; s < 9; s++) {
    f = sprintf("%s/%02d.jsonl", dir, s)
    for (i = 0; i < 600; i++) {
      r = rand(); b = int(rand() * 400)
      if (r < 0.2) t = base[b]
      else if (r < 0.5) {
        n = split(base[b], ws, " ")
        for (k = 0; k < 3; k++) ws[1 + int(rand() * n)] = "x" int(rand() * 3000)
        t = ws[1]; for (k = 2; k <= n; k++) t = t " " ws[k]
      } else {
        t = ""
        for (w = 0; w < 120; w++) t = t (w ? " " : "") "w" int(rand() * 3000)
      }
      if (rand() < 0.1) t = toupper(substr(t, 1, 1)) substr(t, 2) "  "  # equal once normalised
      printf "{\"id\": \"s%d-%d\", \"text\": \"%s\"}\n", s, i, t > f
    }
    close(f)
  }
}'

cat >"$WORK/pipeline.yaml" <<YAML
input:
  paths: [$WORK/in]
batch_mb: 1
progress: none
timeout_s: 60
stages:
  - type: clean
  - type: exact_dedup
  - {type: word_count, min_words: 20}
  - {type: fuzzy_dedup, name: fuzzy_checked, char_ngrams: 12, jaccard_threshold: 0.86}
  - {type: fuzzy_dedup, char_ngrams: 12, partitions: 7}
  - {type: exact_dedup, name: exact_again, normalize: false}
YAML

run() {  # run LABEL NP [MPIRUN OPTIONS...] (NP 0: no mpirun)
  local label=$1 np=$2 rc=0
  shift 2
  if ((np == 0)); then
    timeout -k 5 "$JOB_LIMIT_S" "$NEKTON" curate --config "$WORK/pipeline.yaml" \
      "output.dir=$WORK/$label" >"$WORK/$label.log" 2>&1 || rc=$?
  else
    timeout -k 5 "$JOB_LIMIT_S" mpirun -np "$np" --oversubscribe "$@" "$NEKTON" curate \
      --config "$WORK/pipeline.yaml" "output.dir=$WORK/$label" >"$WORK/$label.log" 2>&1 || rc=$?
  fi
  ((rc == 0)) || fail "the $label run exited with status $rc"
}

# The output's bytes, report.json without timings and spill sizes.
same_output() {  # same_output REF OTHER
  local a=$1 b=$2 f
  for f in "$a"/data/* "$a"/removed/*; do
    cmp -s "$f" "$b/${f#"$a"/}" || fail "$(basename "$b"): ${f#"$a"/} differs from $(basename "$a")'s"
  done
  [[ $(ls "$a/data" | wc -l) == $(ls "$b/data" | wc -l) ]] || fail "$(basename "$b"): other shards"
  local keep='"(seconds|wall_seconds|mb_per_s_per_core|bytes_spilled)"'
  diff <(grep -vE "$keep" "$a/report.json") <(grep -vE "$keep" "$b/report.json") >"$WORK/diff.log" ||
    fail "$(basename "$b"): report.json differs (diff.log)"
}

run one 0
removed=$(grep -c . "$WORK"/one/removed/*.jsonl | awk -F: '{s += $2} END {print s}')
fuzzy=$(cat "$WORK"/one/removed/*.jsonl | grep -c '"removed_by": *"fuzzy_dedup"' || true)
checked=$(cat "$WORK"/one/removed/*.jsonl | grep -c '"removed_by": *"fuzzy_checked"' || true)
rejected=$(grep -A20 '"name": "fuzzy_checked"' "$WORK/one/report.json" |
  sed -n 's/.*"pairs_rejected_by_jaccard": \([0-9]*\).*/\1/p' | head -1)
((removed > 1500 && fuzzy > 30 && checked > 1000 && ${rejected:-0} > 100)) ||
  fail "too few duplicates planted: $removed removed, $checked checked and $fuzzy unchecked near-duplicates, ${rejected:-no} pairs rejected by the Jaccard check"
run two 2
same_output "$WORK/one" "$WORK/two"
run four 4
same_output "$WORK/one" "$WORK/four"
# Over TCP alone, as between hosts.
run two_tcp 2 --mca btl self,tcp
same_output "$WORK/one" "$WORK/two_tcp"

# Rank 1 SIGKILLed once the first global stage has started: the job ends
# non-zero, naming the dead process; the rerun resumes to the same bytes.
timeout -k 5 "$JOB_LIMIT_S" mpirun -np 2 --oversubscribe "$NEKTON" curate \
  --config "$WORK/pipeline.yaml" "output.dir=$WORK/killed" "batch_mb=1" \
  >"$WORK/killed.log" 2>&1 </dev/null &
JOB=$!
JOBS+=("$JOB")
deadline=$((SECONDS + JOB_LIMIT_S))
until compgen -G "$WORK/killed/.work/seg1/*.done.json" >/dev/null ||
  compgen -G "$WORK/killed/.work/global1.spill*" >/dev/null; do
  kill -0 "$JOB" 2>/dev/null || break
  ((SECONDS < deadline)) || fail "the killed run never reached its first global stage"
  sleep 0.02
done
victim=""
killed="no (the run finished first)"
if mpirun_pid=$(pgrep -P "$JOB" -x mpirun); then
  for pid in $(pgrep -P "$mpirun_pid" -x nekton || true); do
    grep -qxzF OMPI_COMM_WORLD_RANK=1 "/proc/$pid/environ" 2>/dev/null && victim=$pid
  done
fi
rc=0
if [[ -n $victim ]]; then
  kill -KILL "$victim"
  killed=yes
  wait "$JOB" || rc=$?
  ((rc != 0)) || fail "the job with a killed rank exited 0"
  grep -q "rank 1" "$WORK/killed.log" || fail "the killed job's output does not name rank 1"
  [[ ! -e $WORK/killed/report.json ]] || fail "a killed run wrote report.json"
else
  wait "$JOB" || rc=$?  # it finished first: the rerun below is then a no-op
fi
run killed 2
same_output "$WORK/one" "$WORK/killed"

# Incremental dedup across ranks: crawl B (shards 4-8) against crawl A's
# saved state (shards 0-3), alone and on 2 and 4 ranks: the same output, and
# the same saved state, byte for byte.
mkdir -p "$WORK/crawl_a" "$WORK/crawl_b"
for f in "$WORK"/in/0[0-3].jsonl; do ln -s "$f" "$WORK/crawl_a/"; done
for f in "$WORK"/in/0[4-8].jsonl; do ln -s "$f" "$WORK/crawl_b/"; done
incremental() {  # incremental LABEL NP CRAWL LOAD SAVE
  local label=$1 np=$2 crawl=$3 load=$4 save=$5 keys rc=0
  keys=""
  [[ -n $load ]] && keys="$keys, load_state: $WORK/$load"
  [[ -n $save ]] && keys="$keys, save_state: $WORK/$save"
  cat >"$WORK/$label.yaml" <<YAML
input:
  paths: [$WORK/$crawl]
output:
  dir: $WORK/$label
batch_mb: 1
progress: none
stages:
  - type: clean
  - {type: exact_dedup${keys//_state: $WORK\//_state: $WORK/exact_}}
  - {type: fuzzy_dedup, char_ngrams: 12, jaccard_threshold: 0.86${keys//_state: $WORK\//_state: $WORK/fuzzy_}}
YAML
  if ((np == 0)); then
    timeout -k 5 "$JOB_LIMIT_S" "$NEKTON" curate --config "$WORK/$label.yaml" \
      >"$WORK/$label.log" 2>&1 || rc=$?
  else
    timeout -k 5 "$JOB_LIMIT_S" mpirun -np "$np" --oversubscribe "$NEKTON" curate \
      --config "$WORK/$label.yaml" >"$WORK/$label.log" 2>&1 || rc=$?
  fi
  ((rc == 0)) || fail "the $label run exited with status $rc"
}
same_state() {  # same_state A B
  local f
  for f in "$WORK/$1"/*; do
    cmp -s "$f" "$WORK/$2/$(basename "$f")" || fail "state $2: $(basename "$f") differs from $1's"
  done
}
incremental inc_a 0 crawl_a "" state_a
incremental inc_b1 0 crawl_b state_a state_b1
against_a=$(cat "$WORK"/inc_b1/removed/*.jsonl | grep -c "of 's[0-3]-" || true)
((against_a > 300)) || fail "crawl b: only $against_a documents removed as duplicates of crawl a's"
for np in 2 4; do
  incremental "inc_b$np" "$np" crawl_b state_a "state_b$np"
  same_output "$WORK/inc_b1" "$WORK/inc_b$np"
  same_state exact_state_b1 "exact_state_b$np"
  same_state fuzzy_state_b1 "fuzzy_state_b$np"
done

pass "1, 2 and 4 ranks (and 2 over TCP alone) write the same bytes ($removed removed; near-duplicates: $checked after the Jaccard check, which rejected $rejected pairs, and $fuzzy more); a killed rank (killed: $killed) ends the job and the rerun resumes to the same bytes; crawl b against crawl a's saved state ($against_a removed as crawl a's duplicates) gives the same output and state on 1, 2 and 4 ranks"
