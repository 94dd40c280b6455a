#!/usr/bin/env bash
# SIGTERM to mpirun during a 2-rank FSDP `nekton train`: mpirun passes it to
# the ranks, which agree to stop after the same step and save a sharded
# checkpoint (every rank's blocks of the weights and moments) before exiting.
# (mpirun itself then exits non-zero, as OpenMPI does when it is signalled.)
# Rerunning the same command resumes from that checkpoint, and every step's
# loss equals, as text, an uninterrupted run's.
#
# usage: sigterm_resume.sh REPO BUILD
set -euo pipefail

REPO=$1
NEKTON=$2/bin/nekton
NAME=sigterm_resume
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
STEPS=150
JOB_LIMIT_S=$((120 * ${NK_TIME_SCALE:-1}))
# Steps of tens of milliseconds: the run is still going when the signal comes.
ARGS=(model.preset=gpt-tiny model.n_layer=2 model.d_model=64 model.n_head=4 model.d_ff=128
      "data.path=$REPO/README.md" train.dtype=f32 train.micro_batch=2 train.seq_len=64
      train.global_batch=32 "train.steps=$STEPS" train.save_every=1000 train.val_every=0
      train.peak_tflops=1 parallel.bucket_mb=0.05 parallel.timeout_s=30 parallel.shard=full)

# shellcheck source=script_lib.sh
source "$(dirname "$0")/script_lib.sh"

# Runs `nekton train` on 2 ranks into OUT_DIR, log WORK/LABEL.log, in the
# background (JOB: its timeout's pid).
start_job() {
  timeout -k 5 "$JOB_LIMIT_S" mpirun -np 2 --oversubscribe "$NEKTON" train "${ARGS[@]}" \
    "train.out_dir=$2" >"$WORK/$1.log" 2>&1 </dev/null &
  JOB=$!
  JOBS+=("$JOB")
}
run_job() {
  local rc=0
  start_job "$@"
  wait "$JOB" || rc=$?
  ((rc == 0)) || fail "the $1 run exited with status $rc"
}
losses() { /usr/bin/python3 -c 'import json, sys
for line in open(sys.argv[1]): r = json.loads(line); print(r["step"], r["loss"])' "$1"; }

run_job reference "$WORK/ref"
start_job stopped "$WORK/run"
stopped=$JOB
until [[ -s $WORK/run/metrics.jsonl ]]; do
  kill -0 "$stopped" 2>/dev/null || fail "the run ended before its first step"
  sleep 0.05
done
mpirun_pid=$(pgrep -P "$stopped" -x mpirun) || fail "no mpirun under timeout (pid $stopped)"
kill -TERM "$mpirun_pid"
wait "$stopped" || true
grep -q "SIGTERM received: stopped cleanly after step" "$WORK/stopped.log" ||
  fail "the ranks did not stop cleanly on SIGTERM"
saved=$(ls "$WORK/run/checkpoints" | grep -c '^step_') || true
((saved == 1)) || fail "expected one checkpoint after SIGTERM, found $saved"
step=$(ls "$WORK/run/checkpoints" | grep '^step_')
ls "$WORK/run/checkpoints/$step" | grep -q '^model\.00001-of-00002\.safetensors$' ||
  fail "the checkpoint holds no weight shard of rank 1"
((10#${step#step_} < STEPS)) || fail "the run finished before the signal came"

run_job resumed "$WORK/run"
grep -q "resuming from checkpoint .*$step" "$WORK/resumed.log" || fail "the rerun did not resume from $step"
if ! d=$(diff <(losses "$WORK/ref/metrics.jsonl") <(losses "$WORK/run/metrics.jsonl")); then
  fail "losses differ from the uninterrupted run:"$'\n'"$d"
fi
pass "SIGTERM stopped both ranks after step $((10#${step#step_})) with a sharded checkpoint; the rerun's $STEPS losses equal an uninterrupted run"
