#!/usr/bin/env bash
# `nekton train` of a Mixture-of-Experts model (mixtral-tiny) over several
# processes equals one process: plain data parallelism (2 and 4 ranks),
# ZeRO-1 and FSDP, 10 steps in f32, every step's loss and the exported
# weights within 1e-5 (each rank's micro-batch routes its own tokens and adds
# its own load-balancing and z-losses, as one process's micro-batches do
# under gradient accumulation). Tensor and expert parallelism are refused,
# naming their keys. DeepSeek-style routing with aux-loss-free balancing
# (the expert loads summed over the ranks) equals one process too.
#   tests/apps/mpi/moe_ranks.sh REPO BUILD
set -euo pipefail
NAME=moe_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/script_lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1

/usr/bin/python3 - "$WORK/c.txt" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    for i in range(300):
        f.write(f"Line {i * 7919 % 1000} of text.\n")
PY
ARGS=(model.preset=mixtral-tiny model.moe_z_loss_coeff=0.001 data.path=$WORK/c.txt
      train.dtype=f32 train.micro_batch=2 train.seq_len=16 train.global_batch=8 train.steps=10
      train.lr=3e-3 train.warmup_steps=2 train.peak_tflops=1 train.val_every=5 train.val_batches=2
      train.threads=1 parallel.bucket_mb=0.05 parallel.timeout_s=60)
run() {
  local out=$1
  shift
  timeout $((120 * ${NK_TIME_SCALE:-1})) "$@" train.out_dir="$WORK/$out" >"$WORK/$out.log" 2>&1 ||
    fail "$out: $*"
}
MPI=(mpirun --oversubscribe -np)
run one "$NK" train "${ARGS[@]}"
run dp2 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}"
run dp4 "${MPI[@]}" 4 "$NK" train "${ARGS[@]}"
run zero1 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" parallel.shard=optimizer
run fsdp "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" parallel.shard=full
grep -q "data parallel: world 2" "$WORK/dp2.log" || fail "dp2 did not run data parallel"
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" one dp2 dp4 zero1 fsdp ||
  fail "a data-parallel run differs from one process"

# DeepSeek-style routing: sigmoid scores, groups, scaling, the sequence-wise
# balancing loss, a dense first layer and aux-loss-free balancing, whose
# expert loads are summed over the ranks before the bias moves: the same
# biases, losses and weights as one process.
DS=(model.moe_score_func=sigmoid model.num_experts=8 model.moe_n_group=4 model.moe_topk_group=2
    model.moe_routed_scaling=2.5 model.moe_aux_loss_type=seq model.moe_aux_loss_coeff=0.01
    model.moe_first_dense_layers=1 model.n_layer=3 model.moe_bias_update_rate=0.01)
run ds_one "$NK" train "${ARGS[@]}" "${DS[@]}"
run ds_dp2 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" "${DS[@]}"
run ds_zero1 "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" "${DS[@]}" parallel.shard=optimizer
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" ds_one ds_dp2 ds_zero1 ||
  fail "a data-parallel run with DeepSeek routing and bias balancing differs from one process"

for key in parallel.tp parallel.ep; do
  if "${MPI[@]}" 2 "$NK" train "${ARGS[@]}" $key=2 train.out_dir="$WORK/$key" \
    >"$WORK/$key.log" 2>&1; then
    fail "$key=2 was not refused"
  fi
  grep -q "$key = 2: a Mixture-of-Experts model (model.num_experts = 4) trains on one process or data parallel only" \
    "$WORK/$key.log" || fail "the refusal does not name $key: $(tail -3 "$WORK/$key.log")"
done
pass "MoE training under DP (2, 4 ranks), ZeRO-1 and FSDP equals one process (DeepSeek routing and aux-loss-free balancing too); TP and EP refused"
