#!/usr/bin/env bash
# `nekton train` of Mixture-of-Experts models under tensor parallelism equals
# one process: each expert split over the tp ranks (parallel.etp =
# parallel.tp, Megatron's expert tensor parallelism: gate | up by rows, down
# by columns; the router whole on every rank), attention split as for a
# dense model. 10 steps in f32, dropless, every step's loss and the exported
# weights within 1e-5 (tests/apps/mpi/compare_runs.py):
#   mixtral-tiny      TP2, TP2 with sequence parallelism, EP2 x TP2 (4 ranks:
#                     tokens dispatched over ep, each expert split over tp),
#                     EP2 x TP2 with full recompute, TP2 x PP2, ZeRO-1 under
#                     EP2 x TP2, a capacity factor under EP2 x TP2
#   qwen2-moe-tiny    TP2 and EP2 x TP2 (its shared expert split as a dense
#                     MLP, its gate whole), TP2 with sequence parallelism
#   qwen3-tiny        TP2 (q/k norms per head, grouped-query attention)
#   qwen3-moe-tiny    TP2, TP2 with sequence parallelism, EP2 x TP2
#                     (these two: gradients at fixed weights, see below)
# A checkpoint saved under EP2 x TP2 at step 5 resumes on one process to
# the same 10 steps, and one saved on one process resumes under TP2.
# (parallel.etp = 1, whole experts: tests/apps/mpi/moe_etp_ranks.sh.)
# Refused, naming the key (moe_etp_ranks.sh: parallel.etp other than 1 and tp): an expert
# width that tp does not divide, a mesh order whose expert tp groups are not
# the attention's.
#   tests/apps/mpi/moe_tp_ranks.sh REPO BUILD
set -euo pipefail
NAME=moe_tp_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/moe_lib.sh"
compare() {
  /usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" "$@" ||
    fail "$* : a tensor-parallel MoE run differs from one process"
}

run one "$NK" train "${MIX[@]}"
run tp2 "${MPI[@]}" 2 "$NK" train "${MIX[@]}" parallel.tp=2
run tp2sp "${MPI[@]}" 2 "$NK" train "${MIX[@]}" parallel.tp=2 parallel.sp=true
run ep2tp2 "${MPI[@]}" 4 "$NK" train "${MIX[@]}" parallel.tp=2 parallel.ep=2
# Saved under EP2 x TP2 at step 5, resumed on one process; saved on one
# process, resumed under TP2.
run ep2tp2to1 "${MPI[@]}" 4 "$NK" train "${MIX[@]}" parallel.tp=2 parallel.ep=2 \
  train.exit_at_step=5
run ep2tp2to1 "$NK" train "${MIX[@]}"
grep -q "resuming from checkpoint" "$WORK/ep2tp2to1.log" || fail "ep2tp2to1 did not resume"
run onetotp2 "$NK" train "${MIX[@]}" train.exit_at_step=5
run onetotp2 "${MPI[@]}" 2 "$NK" train "${MIX[@]}" parallel.tp=2
grep -q "resuming from checkpoint" "$WORK/onetotp2.log" || fail "onetotp2 did not resume"
grep -q "model parallel: world 2 = tp 2" "$WORK/tp2.log" ||
  fail "tp2 did not run tensor parallel: $(grep -m1 parallel "$WORK/tp2.log")"
grep -q "expert parallel: world 4 = tp 2 .* experts etp 2 × ep 2 × edp 1" "$WORK/ep2tp2.log" ||
  fail "ep2tp2 did not run EP2 x TP2: $(grep -m1 parallel "$WORK/ep2tp2.log")"
compare one tp2 tp2sp ep2tp2 ep2tp2to1 onetotp2
run onefull "$NK" train "${MIX[@]}" train.recompute=full
run ep2tp2full "${MPI[@]}" 4 "$NK" train "${MIX[@]}" parallel.tp=2 parallel.ep=2 \
  train.recompute=full
compare onefull ep2tp2full
# TP2 with PP2 (each stage's experts split over tp), ZeRO-1 under EP2 x TP2
# (dp 2 for the dense layers, the experts' state whole: edp 1), and a
# capacity factor under EP2 x TP2 (every tp rank drops the same pairs).
run pp2tp2 "${MPI[@]}" 4 "$NK" train "${MIX[@]}" parallel.tp=2 parallel.pp=2
run ep2tp2zero1 "${MPI[@]}" 4 "$NK" train "${MIX[@]}" parallel.tp=2 parallel.ep=2 \
  parallel.shard=optimizer
compare one pp2tp2 ep2tp2zero1
run onecap "$NK" train "${MIX[@]}" model.moe_capacity_factor=1.0
run ep2tp2cap "${MPI[@]}" 4 "$NK" train "${MIX[@]}" model.moe_capacity_factor=1.0 parallel.tp=2 \
  parallel.ep=2
compare onecap ep2tp2cap

# Qwen2-MoE: the shared expert (its gate whole on every rank), biased q/k/v.
run qone "$NK" train "${QWEN[@]}"
run qtp2 "${MPI[@]}" 2 "$NK" train "${QWEN[@]}" parallel.tp=2
run qtp2sp "${MPI[@]}" 2 "$NK" train "${QWEN[@]}" parallel.tp=2 parallel.sp=true
run qep2tp2 "${MPI[@]}" 4 "$NK" train "${QWEN[@]}" parallel.tp=2 parallel.ep=2
compare qone qtp2 qtp2sp qep2tp2

# Qwen3's q/k norms (one weight over every head's D values) with grouped
# query attention under TP2: each rank's heads add their part of the norms'
# weight gradients, which the trainer sums over the tp group (without that
# sum the gradient norm differed from one process by 5e-6 at the first
# step). Qwen3 amplifies rounding noise through its updates (DP2 alone moves
# its 10-step weights by 6e-6, TP2 by 7e-5), so these runs hold the weights
# still (lr 1e-12) and compare every step's loss and gradient norm, within
# 1e-7, at the same weights on new batches: dense qwen3-tiny and
# qwen3-moe-tiny (TP2, TP2 with SP, EP2 x TP2).
STILL=(train.steps=4 train.lr=1e-12 train.min_lr=0 train.warmup_steps=0)
Q3=(model.preset=qwen3-tiny "${ARGS[@]}" "${STILL[@]}")
Q3MOE=(model.preset=qwen3-moe-tiny model.moe_z_loss_coeff=0.001 "${ARGS[@]}" "${STILL[@]}")
run q3one "$NK" train "${Q3[@]}"
run q3tp2 "${MPI[@]}" 2 "$NK" train "${Q3[@]}" parallel.tp=2
run q3mone "$NK" train "${Q3MOE[@]}"
run q3mtp2 "${MPI[@]}" 2 "$NK" train "${Q3MOE[@]}" parallel.tp=2
run q3mtp2sp "${MPI[@]}" 2 "$NK" train "${Q3MOE[@]}" parallel.tp=2 parallel.sp=true
run q3mep2tp2 "${MPI[@]}" 4 "$NK" train "${Q3MOE[@]}" parallel.tp=2 parallel.ep=2
for pair in "q3one q3tp2" "q3mone q3mtp2" "q3mone q3mtp2sp" "q3mone q3mep2tp2"; do
  /usr/bin/python3 - "$WORK" $pair <<'PY' || fail "$pair: the gradients differ from one process"
import json, sys
work, ref, run = sys.argv[1:]
rec = lambda r: [json.loads(l) for l in open(f"{work}/{r}/metrics.jsonl")]
want, got = rec(ref), rec(run)
assert len(want) == len(got) == 4, (len(want), len(got))
for a, b in zip(got, want):
    for k in ("loss", "grad_norm"):
        rel = abs(a[k] - b[k]) / abs(b[k])
        assert rel <= 1e-7, f"{run} step {a['step']} {k}: {a[k]} vs one process {b[k]} ({rel:.1e})"
print(f"{run}: 4 steps' loss and gradient norm within 1e-7 of {ref}")
PY
done

refuse dff "model.moe_d_ff = 63 is not divisible by parallel.tp = 2" \
  "${MPI[@]}" 2 "$NK" train "${MIX[@]}" model.moe_d_ff=63 parallel.tp=2
refuse order "parallel.order 'ep-tp-cp-dp-pp': the experts' tensor-parallel groups differ" \
  "${MPI[@]}" 4 "$NK" train "${MIX[@]}" parallel.tp=2 parallel.ep=2 parallel.order=ep-tp-cp-dp-pp
pass "MoE training under TP2, TP2 with SP, EP2xTP2 (and with full recompute, ZeRO-1, a capacity factor), TP2xPP2 equals one process for mixtral-tiny, qwen2-moe-tiny (shared expert) and qwen3-moe-tiny (q/k norms; dense qwen3-tiny under TP2 too); an EP2xTP2 checkpoint resumes on one process and a one-process one under TP2; an undivided expert width and a mismatched order refused by key"
