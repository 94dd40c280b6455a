#!/usr/bin/env bash
# `make fuzz`: runs every libFuzzer harness (BUILD/bin/fuzz_*, from
# tests/fuzz) for FUZZ_SECONDS each, on a fresh copy of its seed corpus
# (tests/fuzz/corpus/NAME plus fixtures from the tree), so the committed seeds
# never grow. Any finding fails the run: a crash, a sanitizer report, an
# exception other than nk::Error, an input taking over 10 s, or an allocation
# over 2 GiB. The input that found it is left in BUILD/fuzz/NAME/ and named in
# the log; rerun it with `BUILD/bin/fuzz_NAME FILE`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$root/build-san}")
seconds=${FUZZ_SECONDS:-20}
# A fixed seed: every run (CI's included) walks the same sequence of inputs,
# so a CI run repeats, and on a faster machine extends, what a local run checked.
# FUZZ_SEED=0 asks libFuzzer for a fresh one.
seed=${FUZZ_SEED:-1}
shopt -s nullglob
harnesses=("$build"/bin/fuzz_*)
[ ${#harnesses[@]} -gt 0 ] || { echo "fuzz: no harnesses in $build/bin (build with -DNK_FUZZ=ON)"; exit 1; }
# LeakSanitizer's report is a finding too; see tests/sanitize/lsan.supp.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/sanitize/lsan.supp:print_suppressions=0}

# Fixtures of the tree that are inputs of a harness as they are.
fixtures() {
  case $1 in
    yaml_config) echo "$root"/configs/*.yaml ;;
    jinja) echo "$root"/tests/data/chat/templates/*.jinja ;;
  esac
}

failed=()
for bin in "${harnesses[@]}"; do
  name=${bin##*/fuzz_}
  work=$build/fuzz/$name
  rm -rf "$work"
  mkdir -p "$work/corpus"
  cp "$root/tests/fuzz/corpus/$name"/* $(fixtures "$name") "$work/corpus/" 2>/dev/null || true
  start=$(date +%s)
  # TMPDIR: the harness's scratch files, left here when a finding kills it.
  if TMPDIR=$work "$bin" -seed="$seed" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 \
      -artifact_prefix="$work/" "$work/corpus" >"$work/log" 2>&1; then
    echo "fuzz $name: $(grep -o 'Done [0-9]* runs' "$work/log" || echo done) in $(($(date +%s) - start)) s"
  else
    echo "fuzz $name: FINDING (log: $work/log)"
    { grep -A24 -m1 -E '^==[0-9]+==|runtime error|terminate called|ERROR: libFuzzer' "$work/log" ||
      tail -24 "$work/log"; } | cut -c1-200
    ls "$work"/{crash,leak,timeout,oom}-* 2>/dev/null || true
    failed+=("$name")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]}"
  exit 1
fi
echo "fuzz: ${#harnesses[@]} harnesses, ${seconds} s each, no findings"
