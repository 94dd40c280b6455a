#!/usr/bin/env bash
# `nekton train` of Mixture-of-Experts models with each expert split over
# fewer ranks than the attention (1 < parallel.etp < parallel.tp, Megatron-
# Core's expert_tensor_parallel_size below tensor_model_parallel_size)
# equals one process: under TP4 ETP2 each tp group's two expert-tp groups
# (ranks {0, 1} and {2, 3}) hold their shares of every expert (gate | up by
# rows, down by columns) and split the MoE layers' tokens between them over
# the "expert-token" groups ({0, 2}, {1, 3}; nn/token_split.h). 10 steps in
# f32, dropless, every step's loss and the exported weights within 1e-5
# (tests/apps/mpi/compare_runs.py); 4 ranks of one thread each (8 for dp 2):
#   mixtral-tiny      TP4 ETP2, with sequence parallelism, EP2 x TP4 ETP2
#                     (the ep groups are the expert-token groups: each
#                     rank's tokens dispatched to the other's experts);
#                     on 8 ranks ZeRO-1 and EP2 x DP2 under TP4 ETP2
#   qwen2-moe-tiny    TP4 ETP2 (the shared expert split over etp too, its
#                     gate whole)
# A checkpoint saved under TP4 ETP2 at step 5 resumes under TP4 ETP4 and
# under TP2 ETP1 to the same 10 steps. (model.n_kv_head=4: tp 4 splits the
# key/value heads.) Refused, naming the keys: an etp not dividing tp.
#   tests/apps/mpi/moe_etp_split_ranks.sh REPO BUILD
set -euo pipefail
NAME=moe_etp_split_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/moe_lib.sh"
compare() {
  /usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" "$@" ||
    fail "$* : a run with experts split over etp < tp ranks differs from one process"
}
MIX4=("${MIX[@]}" model.n_kv_head=4)
QWEN4=("${QWEN[@]}" model.n_kv_head=4)
ETP=(parallel.tp=4 parallel.etp=2)

run one "$NK" train "${MIX4[@]}"
run etp2 "${MPI[@]}" 4 "$NK" train "${MIX4[@]}" "${ETP[@]}"
grep -q "world 4 = tp 4 .* experts etp 2 × ep 1 × edp 2" "$WORK/etp2.log" ||
  fail "etp2 did not run TP4 ETP2: $(grep -m1 parallel "$WORK/etp2.log")"
run etp2sp "${MPI[@]}" 4 "$NK" train "${MIX4[@]}" "${ETP[@]}" parallel.sp=true
run ep2etp2 "${MPI[@]}" 4 "$NK" train "${MIX4[@]}" "${ETP[@]}" parallel.ep=2
grep -q "world 4 = tp 4 .* experts etp 2 × ep 2 × edp 1" "$WORK/ep2etp2.log" ||
  fail "ep2etp2 did not run EP2 x TP4 ETP2: $(grep -m1 parallel "$WORK/ep2etp2.log")"
# Saved under TP4 ETP2 at step 5; resumed under TP4 ETP4 and TP2 ETP1.
run toetp4 "${MPI[@]}" 4 "$NK" train "${MIX4[@]}" "${ETP[@]}" train.exit_at_step=5
cp -r "$WORK/toetp4" "$WORK/toetp1"
run toetp4 "${MPI[@]}" 4 "$NK" train "${MIX4[@]}" parallel.tp=4 parallel.etp=4
grep -q "resuming from checkpoint" "$WORK/toetp4.log" || fail "toetp4 did not resume"
run toetp1 "${MPI[@]}" 2 "$NK" train "${MIX4[@]}" parallel.tp=2 parallel.etp=1
grep -q "resuming from checkpoint" "$WORK/toetp1.log" || fail "toetp1 did not resume"
# 8 ranks (dp 2): ZeRO-1 (the optimizer state over dp), EP2 x DP2 (the
# experts' gradients over expert-dp).
run etp2zero1 "${MPI[@]}" 8 "$NK" train "${MIX4[@]}" "${ETP[@]}" parallel.shard=optimizer
run ep2etp2dp2 "${MPI[@]}" 8 "$NK" train "${MIX4[@]}" "${ETP[@]}" parallel.ep=2
grep -q "world 8 = tp 4 × cp 1 × dp 2 .* experts etp 2 × ep 2 × edp 2" "$WORK/ep2etp2dp2.log" ||
  fail "ep2etp2dp2 did not run EP2 x TP4 ETP2 x DP2: $(grep -m1 parallel "$WORK/ep2etp2dp2.log")"
compare one etp2 etp2sp ep2etp2 toetp4 toetp1 etp2zero1 ep2etp2dp2

# Qwen2-MoE: the shared expert split over the expert-tp group as well.
run qone "$NK" train "${QWEN4[@]}"
run qetp2 "${MPI[@]}" 4 "$NK" train "${QWEN4[@]}" "${ETP[@]}"
compare qone qetp2

refuse etp2of3 "parallel.etp = 2 does not divide parallel.tp = 3" \
  "${MPI[@]}" 6 "$NK" train "${MIX[@]}" parallel.tp=3 parallel.etp=2
pass "MoE training with experts split over etp < tp ranks (TP4 ETP2: alone, with SP, with EP2, with ZeRO-1 and EP2xDP2 on 8 ranks) equals one process for mixtral-tiny and qwen2-moe-tiny (shared expert); a TP4 ETP2 checkpoint resumes under TP4 ETP4 and TP2 ETP1; an etp not dividing tp refused by key"
