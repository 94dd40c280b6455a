# shellcheck shell=bash
# Shared by the Mixture-of-Experts rank scripts (moe_ranks.sh, moe_tp_ranks.sh,
# moe_etp_ranks.sh); sourced after NAME is set, with REPO and NK. Brings in
# script_lib.sh (WORK, fail, pass) and gives:
#   ARGS   a 300-line corpus ($WORK/c.txt) and 10 f32 steps of 4 micro-batches
#          of 2 rows of 16 tokens, validation at steps 5 and 10, one thread
#   MIX    mixtral-tiny with a z-loss over ARGS
#   QWEN   qwen2-moe-tiny (shared expert and its gate) likewise
#   MPI    mpirun --oversubscribe -np (then the count)
#   run OUT CMD...   CMD with train.out_dir=$WORK/OUT, its log in $WORK/OUT.log;
#                    fails the test if CMD fails or runs past 180 s
#   refuse OUT PATTERN CMD...  CMD must fail with PATTERN in its log
# shellcheck source=script_lib.sh
source "$REPO/tests/apps/mpi/script_lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1

/usr/bin/python3 - "$WORK/c.txt" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    for i in range(300):
        f.write(f"Line {i * 7919 % 1000} of text.\n")
PY
ARGS=(data.path=$WORK/c.txt
      train.dtype=f32 train.micro_batch=2 train.seq_len=16 train.global_batch=8 train.steps=10
      train.lr=3e-3 train.warmup_steps=2 train.peak_tflops=1 train.val_every=5 train.val_batches=2
      train.threads=1 parallel.bucket_mb=0.05 parallel.timeout_s=60)
MIX=(model.preset=mixtral-tiny model.moe_z_loss_coeff=0.001 "${ARGS[@]}")
# Qwen2's key bias has a zero gradient (softmax ignores a shift shared by
# every key), so AdamW's default epsilon would scale rounding noise of 1e-10
# into steps of the learning rate's size; 1e-6 keeps it from the
# comparison, as it leaves every other update alone.
QWEN=(model.preset=qwen2-moe-tiny model.moe_z_loss_coeff=0.001 train.eps=1e-6 "${ARGS[@]}")
MPI=(mpirun --oversubscribe -np)

run() {
  local out=$1
  shift
  timeout $((180 * ${NK_TIME_SCALE:-1})) "$@" train.out_dir="$WORK/$out" >"$WORK/$out.log" 2>&1 ||
    fail "$out: $*"
}

refuse() {
  local out=$1 pattern=$2
  shift 2
  if "$@" train.out_dir="$WORK/$out" >"$WORK/$out.log" 2>&1; then fail "$out was not refused"; fi
  grep -qF -- "$pattern" "$WORK/$out.log" || fail "$out: no '$pattern': $(tail -3 "$WORK/$out.log")"
}
