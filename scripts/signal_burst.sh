#!/bin/bash
# Sends bursts of SIGTERM to training runs and counts how each run ended:
# rc 0 (stopped cleanly), 143 (a later signal's default action after the
# trainer finished with signals), 134 (abort: a corrupted heap).
#   scripts/signal_burst.sh [NEKTON] [RUNS]
# Each run trains gpt-tiny on a small text corpus (micro-batch 1, so the
# time is spent in many small GEMMs) and gets 300 SIGTERMs 10 ms apart from
# 1.5 s on. See docs/checkpoints.md.
set -euo pipefail
BIN=${1:-build/bin/nekton}
RUNS=${2:-10}
BIN=$(realpath "$BIN")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -c 20000 /dev/zero | tr '\0' x >"$work/c.txt"
for i in $(seq 1 "$RUNS"); do
  rm -rf "$work/run"
  "$BIN" train data.path="$work/c.txt" train.out_dir="$work/run" train.seq_len=64 \
    train.micro_batch=1 train.global_batch=16 train.steps=100000 train.val_every=0 \
    train.peak_tflops=1 >"$work/log" 2>&1 &
  pid=$!
  sleep 1.5
  for _ in $(seq 1 300); do
    kill -TERM "$pid" 2>/dev/null || break
    sleep 0.01
  done
  rc=0
  wait "$pid" 2>/dev/null || rc=$?
  echo "rc $rc"
done | sort | uniq -c
