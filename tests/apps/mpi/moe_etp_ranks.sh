#!/usr/bin/env bash
# `nekton train` of Mixture-of-Experts models with the experts whole on every
# tensor-parallel rank (parallel.etp = 1 under parallel.tp = 2: Megatron-
# Core's expert tensor-parallel group decoupled from the attention's) equals
# one process: the attention split over tp as for a dense model, each MoE
# layer's rows split over the tp ranks instead (nn/token_split.h), the
# router's statistics summed over them. 10 steps in f32, dropless, every
# step's loss and the exported weights within 1e-5
# (tests/apps/mpi/compare_runs.py):
#   mixtral-tiny      TP2 ETP1, TP2 ETP1 with sequence parallelism, EP2 x TP2
#                     ETP1 on 2 ranks (the ep group is the tp group: each
#                     rank's tokens dispatched to the other's experts), the
#                     same on 4 ranks (dp 2, experts' gradients over
#                     expert-dp), TP2 ETP1 with PP2, ZeRO-1 under TP2 ETP1
#   qwen2-moe-tiny    TP2 ETP1 (the shared expert and its gate whole too)
# A checkpoint saved under EP2 x TP2 ETP1 at step 5 resumes on one process
# to the same 10 steps, and one saved on one process resumes under TP2
# ETP1. Refused, naming the keys: parallel.etp above parallel.tp, a
# capacity factor under etp 1, ZeRO-1 with ep under etp 1. (Experts split
# over 1 < etp < tp ranks: moe_etp_split_ranks.sh.)
#   tests/apps/mpi/moe_etp_ranks.sh REPO BUILD
set -euo pipefail
NAME=moe_etp_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/moe_lib.sh"
compare() {
  /usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" "$@" ||
    fail "$* : a run with whole experts under TP differs from one process"
}
ETP=(parallel.tp=2 parallel.etp=1)

run one "$NK" train "${MIX[@]}"
run etp1 "${MPI[@]}" 2 "$NK" train "${MIX[@]}" "${ETP[@]}"
run etp1sp "${MPI[@]}" 2 "$NK" train "${MIX[@]}" "${ETP[@]}" parallel.sp=true
run ep2etp1 "${MPI[@]}" 2 "$NK" train "${MIX[@]}" "${ETP[@]}" parallel.ep=2
grep -q "world 2 = tp 2 .* experts etp 1 × ep 2 × edp 1" "$WORK/ep2etp1.log" ||
  fail "ep2etp1 did not run EP2 x TP2 ETP1: $(grep -m1 parallel "$WORK/ep2etp1.log")"
run ep2etp1dp2 "${MPI[@]}" 4 "$NK" train "${MIX[@]}" "${ETP[@]}" parallel.ep=2
grep -q "world 4 = tp 2 × cp 1 × dp 2 .* experts etp 1 × ep 2 × edp 2" "$WORK/ep2etp1dp2.log" ||
  fail "ep2etp1dp2 did not run EP2 x TP2 ETP1 x DP2: $(grep -m1 parallel "$WORK/ep2etp1dp2.log")"
# Saved under EP2 x TP2 ETP1 at step 5, resumed on one process; saved on
# one process, resumed under TP2 ETP1.
run ep2etp1to1 "${MPI[@]}" 2 "$NK" train "${MIX[@]}" "${ETP[@]}" parallel.ep=2 \
  train.exit_at_step=5
run ep2etp1to1 "$NK" train "${MIX[@]}"
grep -q "resuming from checkpoint" "$WORK/ep2etp1to1.log" || fail "ep2etp1to1 did not resume"
run onetoetp1 "$NK" train "${MIX[@]}" train.exit_at_step=5
run onetoetp1 "${MPI[@]}" 2 "$NK" train "${MIX[@]}" "${ETP[@]}"
grep -q "resuming from checkpoint" "$WORK/onetoetp1.log" || fail "onetoetp1 did not resume"
compare one etp1 etp1sp ep2etp1 ep2etp1dp2 ep2etp1to1 onetoetp1
run etp1pp2 "${MPI[@]}" 4 "$NK" train "${MIX[@]}" "${ETP[@]}" parallel.pp=2
run etp1zero1 "${MPI[@]}" 4 "$NK" train "${MIX[@]}" "${ETP[@]}" parallel.shard=optimizer
compare one etp1pp2 etp1zero1

# Qwen2-MoE: the shared expert and its gate whole on every rank as well.
run qone "$NK" train "${QWEN[@]}"
run qetp1 "${MPI[@]}" 2 "$NK" train "${QWEN[@]}" "${ETP[@]}"
run qetp1sp "${MPI[@]}" 2 "$NK" train "${QWEN[@]}" "${ETP[@]}" parallel.sp=true
compare qone qetp1 qetp1sp

refuse etp2 "parallel.etp = 2 with parallel.tp = 1: only parallel.etp = parallel.tp" \
  "${MPI[@]}" 2 "$NK" train "${MIX[@]}" parallel.etp=2
refuse cap "parallel.etp = 1 with parallel.tp = 2: model.moe_capacity_factor" \
  "${MPI[@]}" 2 "$NK" train "${MIX[@]}" "${ETP[@]}" model.moe_capacity_factor=1.0
refuse zero1ep "parallel.etp = 1 with parallel.tp = 2: parallel.shard (ZeRO-1 / FSDP) with parallel.ep" \
  "${MPI[@]}" 4 "$NK" train "${MIX[@]}" "${ETP[@]}" parallel.ep=2 parallel.shard=optimizer
pass "MoE training with whole experts under TP2 (parallel.etp=1: with SP, EP2 on the tp ranks, EP2xDP2, PP2, ZeRO-1) equals one process for mixtral-tiny and qwen2-moe-tiny (shared expert); an EP2xTP2 ETP1 checkpoint resumes on one process and a one-process one under TP2 ETP1; other etp, a capacity factor and ZeRO-1 with ep under etp 1 refused by key"
