#!/usr/bin/env bash
# DeepSeek-V2/V3 (Multi-head Latent Attention, fine-grained and shared
# experts, dense first layers; V3's sigmoid group-limited routing with
# aux-loss-free biases) under `nekton train` over ranks equals one process:
# 10 steps in f32, every step's loss and the exported weights within 1e-5
# (tests/apps/mpi/compare_runs.py):
#   deepseek_v3-tiny (4 layers)  DP2, EP2, PP2 (1F1B and interleaved VP2),
#                                EP2 x PP2 (4 ranks), ZeRO-1 under EP2 x DP2
#                                (4 ranks); an EP2 checkpoint resumed on one
#                                process; TP2 x PP2 with the experts whole
#                                on each tp rank (parallel.etp=1 < tp: the MoE
#                                layers' tokens split over tp; 4 ranks), CP2
#                                and CP2 x EP2 (4 ranks), the weights per
#                                tensor within 1e-4
#   deepseek_v2-tiny             EP2 and PP2 (its softmax routing)
# Usage: deepseek_ranks.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
REPO=$1
NK=$2/bin/nekton
NAME=deepseek_ranks
# shellcheck source=moe_lib.sh
source "$REPO/tests/apps/mpi/moe_lib.sh"

V3=(model.preset=deepseek_v3-tiny model.n_layer=4 "${ARGS[@]}")
run v3 "$NK" train "${V3[@]}"
run v3dp2 "${MPI[@]}" 2 "$NK" train "${V3[@]}"
run v3ep2 "${MPI[@]}" 2 "$NK" train "${V3[@]}" parallel.ep=2
run v3pp2 "${MPI[@]}" 2 "$NK" train "${V3[@]}" parallel.pp=2
run v3pp2vp2 "${MPI[@]}" 2 "$NK" train "${V3[@]}" parallel.pp=2 parallel.vp=2
run v3ep2pp2 "${MPI[@]}" 4 "$NK" train "${V3[@]}" parallel.ep=2 parallel.pp=2
run v3ep2zero1 "${MPI[@]}" 4 "$NK" train "${V3[@]}" parallel.ep=2 parallel.shard=optimizer
run v3tp2etp1pp2 "${MPI[@]}" 4 "$NK" train "${V3[@]}" parallel.tp=2 parallel.etp=1 parallel.pp=2
grep -q "world 4 = tp 2 .*pp 2, experts etp 1" "$WORK/v3tp2etp1pp2.log" ||
  fail "v3tp2etp1pp2 did not run TP2 ETP1 x PP2: $(grep -m1 parallel "$WORK/v3tp2etp1pp2.log")"
run v3ep2to1 "${MPI[@]}" 2 "$NK" train "${V3[@]}" parallel.ep=2 train.exit_at_step=5
run v3ep2to1 "$NK" train "${V3[@]}"
grep -q "resuming from checkpoint" "$WORK/v3ep2to1.log" || fail "v3ep2to1 did not resume"
grep -q "interleaved 1F1B" "$WORK/v3pp2vp2.log" || fail "v3pp2vp2 did not run the interleaved schedule"
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" v3 v3dp2 v3ep2 v3pp2 v3pp2vp2 \
  v3ep2pp2 v3ep2zero1 v3ep2to1 || fail "a DeepSeek-V3 run over ranks differs from one process"

# The layouts whose forward adds in another order, the weights per tensor
# within 1e-4 (2-norm) and the losses as above:
# - Context parallelism: the MLA layer builds an ordinary fused qkv and
#   rotates at the chunks' global positions, so it runs through the ring,
#   which merges the blocks in another order.
# - TP2: the attention's row-parallel output is the sum of two ranks' partial
#   products, so every activation after it differs from one process by
#   rounding (DP, EP and PP leave the forward's bits alone). Adam carries that
#   into whole steps of size lr for the few elements whose gradient nearly
#   cancels (compare_runs.py): on a Zen 5 at avx512_bf16, 20 of h.2.moe.up's
#   32,768 elements moved by more than 1e-6, the worst by 1.5e-5, its
#   exp_avg 2.6e-7 against a median of 1.3e-5; the tensors within 6e-6.
run v3cp2 "${MPI[@]}" 2 "$NK" train "${V3[@]}" parallel.cp=2
run v3cp2ep2 "${MPI[@]}" 4 "$NK" train "${V3[@]}" parallel.cp=2 parallel.ep=2
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" --tensor-norm "$WORK" v3 v3cp2 v3cp2ep2 \
  v3tp2etp1pp2 || fail "a DeepSeek-V3 run under context or tensor parallelism differs from one process"

V2=(model.preset=deepseek_v2-tiny model.n_layer=4 "${ARGS[@]}")
run v2 "$NK" train "${V2[@]}"
run v2ep2 "${MPI[@]}" 2 "$NK" train "${V2[@]}" parallel.ep=2
run v2pp2 "${MPI[@]}" 2 "$NK" train "${V2[@]}" parallel.pp=2
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" v2 v2ep2 v2pp2 ||
  fail "a DeepSeek-V2 run over ranks differs from one process"
pass "DeepSeek-V3 (MLA, sigmoid group-limited routing, aux-loss-free biases) under DP2, EP2," \
  "PP2, PP2 VP2, EP2 x PP2, ZeRO-1 EP2 x DP2, TP2 ETP1 x PP2, CP2, CP2 x EP2 and an EP2" \
  "checkpoint resumed" \
  "on one process," \
  "and DeepSeek-V2 under EP2 and PP2, equal one process"
