#!/usr/bin/env bash
# A rank of a data-parallel `nekton train` (2 ranks, ZeRO-1) is SIGKILLed in
# the middle of the run. The whole job must then end, non-zero, within
# parallel.timeout_s + 10 s, and its output must name the dead rank (mpirun
# stops the job when it sees a rank die). A rank that stops answering
# (SIGSTOP) must end the job the same way, through rank 0's own timeout,
# which names the group, the operation and the missing rank. Rerunning
# the same command must resume from the newest complete checkpoint, finish all
# steps with each step recorded once in metrics.jsonl, and reproduce the losses
# of a run that was never interrupted, as text (resume is exact on the CPU).
#
# usage: rank_kill_resume.sh REPO BUILD
set -euo pipefail

REPO=$1
BUILD=$2
NEKTON=$BUILD/bin/nekton
NAME=rank_kill_resume
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1

STEPS=40
PEER_TIMEOUT_S=5  # parallel.timeout_s
JOB_LIMIT_S=$((120 * ${NK_TIME_SCALE:-1}))   # any one mpirun: a hang fails the test instead of blocking it
# A tiny model, but with 8 micro-batches per rank per step so that a step takes
# tens of milliseconds: the run must still be going when the first checkpoint
# (step 5) shows up and rank 1 is killed.
ARGS=(model.preset=gpt-tiny model.n_layer=2 model.d_model=64 model.n_head=4 model.d_ff=128
      "data.path=$REPO/README.md" train.dtype=f32 train.micro_batch=2 train.seq_len=64
      train.global_batch=32 "train.steps=$STEPS" train.save_every=5 train.val_every=0
      train.peak_tflops=1 parallel.bucket_mb=0.05 "parallel.timeout_s=$PEER_TIMEOUT_S"
      parallel.shard=optimizer)

# shellcheck source=script_lib.sh
source "$(dirname "$0")/script_lib.sh"

# Starts `nekton train` under mpirun with 2 ranks in the background, bounded by
# `timeout`, writing OUT_DIR and WORK/LABEL.log; sets JOB to the timeout's pid.
start_job() {
  local label=$1 out=$2
  timeout -k 5 "$JOB_LIMIT_S" mpirun -np 2 --oversubscribe "$NEKTON" train "${ARGS[@]}" \
    "train.out_dir=$out" >"$WORK/$label.log" 2>&1 </dev/null &
  JOB=$!
  JOBS+=("$JOB")
}

# Runs a job to its end; fails unless it exits 0.
run_job() {
  local label=$1 rc=0
  start_job "$@"
  wait "$JOB" || rc=$?
  ((rc == 0)) || fail "the $label run exited with status $rc"
}

# "STEP LOSS" per line of a metrics.jsonl, the loss as written.
losses() {
  sed -E 's/.*"step": ([0-9]+),.*"loss": ([^,}]+).*/\1 \2/' "$1"
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

[[ -x $NEKTON ]] || fail "no executable $NEKTON"
command -v mpirun >/dev/null || fail "mpirun is not on PATH"

# The reference: the same command, never interrupted.
run_job reference "$WORK/ref"

# Starts the run LABEL in RUN, sends SIGNAL to rank 1 once the first
# checkpoint exists, and waits for the job to end by itself within
# parallel.timeout_s + 10 s of it; sets rc (its status) and ELAPSED_MS.
signal_rank1() {
  local label=$1 run=$2 signal=$3
  start_job "$label" "$run"
  local job=$JOB deadline
  deadline=$(($(now_ms) + JOB_LIMIT_S * 1000))
  until compgen -G "$run/checkpoints/step_*" >/dev/null; do
    kill -0 "$job" 2>/dev/null || fail "the $label run ended before writing a checkpoint"
    (($(now_ms) < deadline)) || fail "no checkpoint after $JOB_LIMIT_S s"
    sleep 0.05
  done
  # timeout -> mpirun -> the ranks; OpenMPI gives each rank its world rank in
  # OMPI_COMM_WORLD_RANK.
  local mpirun_pid victim="" pid
  mpirun_pid=$(pgrep -P "$job" -x mpirun) || fail "no mpirun under timeout (pid $job)"
  for pid in $(pgrep -P "$mpirun_pid" -x nekton || true); do
    if grep -qxzF OMPI_COMM_WORLD_RANK=1 "/proc/$pid/environ" 2>/dev/null; then
      victim=$pid
    fi
  done
  [[ -n $victim ]] || fail "no nekton process with OMPI_COMM_WORLD_RANK=1 under mpirun $mpirun_pid"
  kill "-$signal" "$victim" 2>/dev/null || fail "rank 1 (pid $victim) had already exited: the run ended first"
  local kill_ms end_by
  kill_ms=$(now_ms)
  end_by=$((kill_ms + (PEER_TIMEOUT_S + 10) * 1000))
  while kill -0 "$job" 2>/dev/null; do
    (($(now_ms) < end_by)) || fail "the $label job still runs $((PEER_TIMEOUT_S + 10)) s after SIG$signal to rank 1"
    sleep 0.1
  done
  rc=0
  wait "$job" || rc=$?
  ELAPSED_MS=$(($(now_ms) - kill_ms))
  # (mpirun exits 137 = 128 + SIGKILL after a kill; 124 would be `timeout`.)
  ((rc != 0)) || fail "the $label job exited 0 after SIG$signal to rank 1"
  ((rc != 124)) || fail "the $label job did not end by itself: timeout stopped it"
}

# 1. As launched by default: mpirun sees rank 1 die and stops the job itself
# (SIGTERM, then SIGKILL a second later), printing
#   "mpirun noticed that process rank 1 with PID 0 on node HOST exited on signal 9 (Killed)."
RUN=$WORK/run
signal_rank1 killed "$RUN" KILL
grep -Eq 'process rank 1 .*exited on signal 9' "$WORK/killed.log" ||
  fail "the output of the killed job does not name rank 1 as killed"
KILLED_RC=$rc KILLED_MS=$ELAPSED_MS

# 2. A hung rank (stopped, so mpirun sees nothing wrong): rank 0's wait times
# out after parallel.timeout_s, names the group, the operation and the missing
# rank, and ends the job (MPI_Abort).
signal_rank1 peer_timeout "$WORK/run2" STOP
grep -Eq "nekton rank 0: .*group '(dp-cp|world)' [a-z_]+ #[0-9]+ timed out after $PEER_TIMEOUT_S.0 s: missing rank 1" \
  "$WORK/peer_timeout.log" ||
  fail "rank 0 did not report the missing rank 1 with its group and operation"

lines=$(wc -l <"$RUN/metrics.jsonl")
((lines < STEPS)) || fail "the killed run had recorded all $STEPS steps: it was not killed mid-run"

# The newest complete checkpoint: the last step_N (zero-padded, so the glob
# sorts by step) holding a manifest.json.
NEWEST=""
for manifest in "$RUN"/checkpoints/step_*/manifest.json; do
  [[ -e $manifest ]] && NEWEST=$(basename "$(dirname "$manifest")")
done
[[ -n $NEWEST ]] || fail "no checkpoint with a manifest.json in $RUN/checkpoints"
NEWEST_STEP=$((10#${NEWEST#step_}))

# Rerun the same command: it resumes from that checkpoint and finishes.
run_job resumed "$RUN"
resume_line=$(grep -m1 'resuming from checkpoint' "$WORK/resumed.log") ||
  fail "the rerun did not print 'resuming from checkpoint'"
[[ $resume_line =~ resuming\ from\ checkpoint\ ([^ ]+)\ at\ step\ ([0-9]+) ]] ||
  fail "unexpected resume line: $resume_line"
[[ $(basename "${BASH_REMATCH[1]}") == "$NEWEST" && ${BASH_REMATCH[2]} == "$NEWEST_STEP" ]] ||
  fail "resumed from '${BASH_REMATCH[1]}' at step ${BASH_REMATCH[2]}, expected $NEWEST (step $NEWEST_STEP)"

# Steps 1..STEPS each once, in order, and at every step (those after the resume
# point included) the loss of the uninterrupted run.
diff <(losses "$RUN/metrics.jsonl" | cut -d' ' -f1) <(seq 1 "$STEPS") >/dev/null ||
  fail "metrics.jsonl does not hold steps 1..$STEPS each once: $(losses "$RUN/metrics.jsonl" | cut -d' ' -f1 | tr '\n' ' ')"
if ! d=$(diff <(losses "$WORK/ref/metrics.jsonl") <(losses "$RUN/metrics.jsonl")); then
  fail "losses differ from the uninterrupted run (< reference, > killed + resumed):"$'\n'"$d"
fi

pass "rank 1 killed with $lines steps recorded, job ended with status $KILLED_RC in" \
  "$((KILLED_MS / 1000)).$((KILLED_MS % 1000 / 100)) s naming it (a stopped rank 1: rank 0's timeout" \
  "named it, job ended in $((ELAPSED_MS / 1000)).$((ELAPSED_MS % 1000 / 100)) s); resumed from $NEWEST;" \
  "$STEPS steps match the uninterrupted run"
