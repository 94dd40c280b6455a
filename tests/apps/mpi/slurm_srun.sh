#!/usr/bin/env bash
# `nekton train` launched by a real Slurm (Debian's slurm-wlm and munge): the
# script starts a single-node cluster of its own on 127.0.0.1 (munged,
# slurmctld and slurmd, a generated slurm.conf, free ports, everything under
# its work folder) and stops it on exit. Checks:
#   - `srun -n 2 --mpi=pmix nekton train` (Open MPI's direct launch through
#     PMIx) under data parallelism (DP2) and tensor parallelism (TP2): every
#     step's loss, gradient norm and validation loss equal, as text, the same
#     run under mpirun; rank 0 alone writes the TensorBoard event file;
#   - an sbatch job (--requeue) sent SIGTERM by `scancel --signal=TERM` stops
#     after a step with a checkpoint; `scontrol requeue` runs the batch script
#     again, which resumes from it and ends on an uninterrupted run's losses,
#     its TensorBoard file continuing the step axis once.
# SKIPPED (with the reason) where the cluster cannot start: not root, the
# packages missing (scripts/setup.sh --test installs them), or a daemon that
# does not come up.
#
# usage: slurm_srun.sh REPO BUILD
set -euo pipefail

REPO=$1
NEKTON=$2/bin/nekton
NAME=slurm_srun
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
LIMIT_S=$((120 * ${NK_TIME_SCALE:-1}))

skip() {
  VERDICT=skipped
  echo "SKIPPED: $NAME: $*"
  exit 0
}
[[ $(id -u) == 0 ]] || { echo "SKIPPED: $NAME: slurmd must run as root to start jobs"; exit 0; }
for tool in munged slurmctld slurmd srun sbatch scancel scontrol sinfo mpirun; do
  command -v "$tool" >/dev/null ||
    { echo "SKIPPED: $NAME: $tool not found (Debian's slurm-wlm and munge: scripts/setup.sh --test)"; exit 0; }
done

# shellcheck source=script_lib.sh
source "$(dirname "$0")/script_lib.sh"

# The cluster: its daemons (under `timeout`, which passes signals on), stopped
# and waited for on any exit; should this script be killed outright (a
# SIGKILL runs no trap), they still end within DAEMON_LIMIT_S.
DAEMON_LIMIT_S=$((5 * LIMIT_S))
DAEMONS=()
cleanup() {
  local pid
  for pid in "${DAEMONS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${DAEMONS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}

free_ports() {
  /usr/bin/python3 -c 'import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))'
}
read -r CTLD_PORT SLURMD_PORT < <(free_ports)
HOST=$(hostname -s)
C=$WORK/cluster
mkdir -p "$C/state" "$C/spool"
dd if=/dev/urandom of="$C/munge.key" bs=1024 count=1 status=none
chmod 600 "$C/munge.key"
# No cgroups (containers rarely allow them): processes tracked through /proc,
# CPUs oversubscribed (two ranks on however many cores the machine has). A
# requeued job is eligible cred_expire + 1 s after its requeue (Slurm's
# default: 120 s) and is started by the next scheduling pass (sched_interval,
# default 60 s): both shortened so the test waits seconds, not minutes.
cat >"$C/slurm.conf" <<CONF
ClusterName=nekton
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$C/munge.sock,cred_expire=10
StateSaveLocation=$C/state
SlurmdSpoolDir=$C/spool
SlurmctldPidFile=$C/slurmctld.pid
SlurmdPidFile=$C/slurmd.pid
SlurmctldLogFile=$C/slurmctld.log
SlurmdLogFile=$C/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
MpiDefault=none
KillWait=30
NodeName=nk1 NodeAddr=127.0.0.1 NodeHostname=$HOST CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=nk1 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF=$C/slurm.conf

cluster_logs() {
  local f
  for f in "$C"/munged.log "$C"/slurmctld.log "$C"/slurmd.log; do
    [[ -e $f ]] && { echo "--- $(basename "$f") (last lines)"; tail -n 15 "$f"; }
  done
  return 0
}
timeout -k 5 "$DAEMON_LIMIT_S" munged --foreground --socket="$C/munge.sock" --key-file="$C/munge.key" \
  --pid-file="$C/munged.pid" --log-file="$C/munged.log" --seed-file="$C/munge.seed" --force \
  >/dev/null 2>&1 &
DAEMONS+=($!)
for _ in $(seq 100); do [[ -S $C/munge.sock ]] && break; sleep 0.1; done
[[ -S $C/munge.sock ]] || { cluster_logs; skip "munged did not start"; }
timeout -k 5 "$DAEMON_LIMIT_S" slurmctld -D -i >"$C/slurmctld.out" 2>&1 &
DAEMONS+=($!)
timeout -k 5 "$DAEMON_LIMIT_S" slurmd -D -N nk1 >"$C/slurmd.out" 2>&1 &
DAEMONS+=($!)
up=0
for _ in $(seq 150); do
  if sinfo -h -n nk1 -o %t 2>/dev/null | grep -qx idle; then up=1; break; fi
  sleep 0.2
done
((up)) || { cluster_logs; skip "the Slurm node did not come up (see the daemons' logs above)"; }
srun --mpi=list 2>&1 | grep -qw pmix || skip "this Slurm has no PMIx plugin (srun --mpi=list)"

ARGS=(model.preset=gpt-tiny model.n_layer=2 model.d_model=64 model.n_head=4 model.d_ff=128
      model.vocab_size=264 "data.path=$REPO/README.md" train.dtype=f32 train.micro_batch=2
      train.seq_len=32 train.global_batch=8 train.steps=6 train.val_every=3 train.val_batches=2
      train.peak_tflops=1 train.threads=1 parallel.bucket_mb=0.05 parallel.timeout_s=60)
# The run's one TensorBoard event file read back against its metrics.jsonl
# (tests/train/tfevents_check.py: CRCs, steps, every scalar).
tensorboard_check() {
  local files=("$WORK/$1"/events.out.tfevents.*)
  ((${#files[@]} == 1)) || fail "$1: ${#files[@]} TensorBoard event files, expected one"
  /usr/bin/python3 "$REPO/tests/train/tfevents_check.py" "${files[0]}" "$WORK/$1/metrics.jsonl" \
    >"$WORK/$1.tfevents.log" 2>&1 || fail "$1: the event file: $(cat "$WORK/$1.tfevents.log")"
}
# step, loss, gradient norm and validation loss of a run, as text
figures() { /usr/bin/python3 -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line); print(r["step"], r["loss"], r["grad_norm"], r.get("val_loss"))' "$1"; }
# run OUT LAUNCHER...: nekton train with ARGS and LAYOUT (an array) under LAUNCHER
run() {
  local out=$1
  shift
  timeout -k 5 "$LIMIT_S" "$@" "$NEKTON" train "${ARGS[@]}" "${LAYOUT[@]}" "train.out_dir=$WORK/$out" \
    >"$WORK/$out.log" 2>&1 </dev/null || { cluster_logs; fail "$out: $*"; }
}
for layout in dp tp; do
  LAYOUT=()
  [[ $layout == tp ]] && LAYOUT=(parallel.tp=2)
  run "${layout}_mpirun" mpirun -np 2 --oversubscribe
  run "${layout}_srun" srun -n 2 --mpi=pmix
  grep -q "world 2" "$WORK/${layout}_srun.log" || fail "srun: not one job of 2 ranks"
  if ! d=$(diff <(figures "$WORK/${layout}_mpirun/metrics.jsonl") \
                <(figures "$WORK/${layout}_srun/metrics.jsonl")); then
    fail "$layout: srun's figures differ from mpirun's:"$'\n'"$d"
  fi
  # Rank 0 alone writes the TensorBoard file: one, equal to metrics.jsonl.
  tensorboard_check "${layout}_srun"
  # Rank 0 alone prints the step log: once, not twice.
  (($(grep -c '^step     6/6' "$WORK/${layout}_srun.log") == 1)) || fail "$layout: step log not printed once"
done

# scancel --signal=TERM, then scontrol requeue: the batch script runs again and resumes.
STEPS=300
LONG=(model.preset=gpt-tiny model.n_layer=2 model.d_model=64 model.n_head=4 model.d_ff=128
      "data.path=$REPO/README.md" train.dtype=f32 train.micro_batch=2 train.seq_len=64
      train.global_batch=32 "train.steps=$STEPS" train.save_every=1000 train.val_every=0
      train.peak_tflops=1 train.threads=1 parallel.bucket_mb=0.05 parallel.timeout_s=60)
run_long() {
  timeout -k 5 "$LIMIT_S" mpirun -np 2 --oversubscribe "$NEKTON" train "${LONG[@]}" \
    "train.out_dir=$WORK/$1" >"$WORK/$1.log" 2>&1 </dev/null || fail "$1 run"
}
run_long reference
cat >"$WORK/job.sh" <<JOB
#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=$WORK/job.log
echo "batch script: job \$SLURM_JOB_ID, restart \${SLURM_RESTART_COUNT:-0}"
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
srun --mpi=pmix "$NEKTON" train ${LONG[*]} train.out_dir=$WORK/job
JOB
job=$(sbatch --parsable "$WORK/job.sh") || fail "sbatch refused the job"
deadline=$((SECONDS + LIMIT_S))
until [[ -s $WORK/job/metrics.jsonl ]]; do
  ((SECONDS < deadline)) || { cluster_logs; fail "the job logged no step"; }
  sleep 0.05
done
scancel --signal=TERM "$job"
state() { scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
until [[ $(state) == COMPLETED ]]; do
  ((SECONDS < deadline)) || { cluster_logs; fail "the signalled job did not complete (state $(state))"; }
  sleep 0.2
done
grep -q "SIGTERM received: stopped cleanly after step" "$WORK/job.log" ||
  fail "the ranks did not stop cleanly on scancel's SIGTERM"
step=$(ls "$WORK/job/checkpoints" | grep '^step_') || fail "no checkpoint after SIGTERM"
((10#${step#step_} < STEPS)) || fail "the job finished before the signal came"
scontrol requeue "$job" || fail "scontrol requeue $job"
until [[ $(state) == COMPLETED ]] && grep -q "restart 1" "$WORK/job.log"; do
  ((SECONDS < deadline)) || { cluster_logs; fail "the requeued job did not complete (state $(state))"; }
  sleep 0.2
done
grep -q "resuming from checkpoint .*$step" "$WORK/job.log" || fail "the requeued job did not resume from $step"
if ! d=$(diff <(figures "$WORK/reference/metrics.jsonl") <(figures "$WORK/job/metrics.jsonl")); then
  fail "the requeued job's losses differ from an uninterrupted run's:"$'\n'"$d"
fi
tensorboard_check job  # the step axis continued once across the requeue
pass "srun -n 2 --mpi=pmix equals mpirun under DP2 and TP2; scancel --signal=TERM stopped job $job after step $((10#${step#step_})) with a checkpoint and the requeued job resumed onto the uninterrupted run's $STEPS losses"
