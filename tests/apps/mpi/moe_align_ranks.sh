#!/usr/bin/env bash
# `nekton align` on a Mixture-of-Experts model (mixtral-tiny: four experts,
# top-2; the balancing and z-losses logged, in an alignment objective's
# gradient only with align.moe_losses=true) under expert parallelism equals one
# process (f32, every step's loss and figures and the exported weights
# within 1e-5). DPO with the precomputed reference (every rank computes
# every sequence, so the ep group's all-to-alls pair up) under EP2, EP2 x
# DP2, EP2 x TP2, EP2 with PP2, ZeRO-1 and FSDP under EP2; a frozen-copy
# reference and KTO under EP2; a reward model under EP2 and EP2 x TP2
# (exported as HF's MixtralForSequenceClassification); LoRA on every linear
# layer (the experts included) with the router trained, under EP2 (per
# tensor); with align.moe_losses=true, DPO under EP2, EP2 x DP2, EP2 x TP2
# and EP2 with PP2, a reward model under EP2. Online RL (the
# policy gathered whole, its experts from the ep ranks, for each round's
# generations): GRPO with a command grader under EP2, EP2 x DP2, EP2 x TP2
# and EP2 with PP2 (with align.moe_losses=true under EP2 and EP2 x TP2),
# and under TP2 alone with the experts split or whole (parallel.etp=1), and
# DeepSeek-V3's under TP2, each round generated from the split policy (the
# cached decode under TP);
# PPO under EP2, and with a critic of its own (the MoE reward model) under EP2
# and EP2 x TP2; LoRA GRPO (adapters off as the
# reference) under EP2; a GRPO run stopped mid-round under EP2 resumes under
# EP2 and on one process; QLoRA GRPO (from the DPO run's model) under EP2
# (per tensor).
#   tests/apps/mpi/moe_align_ranks.sh REPO BUILD
set -euo pipefail
NAME=moe_align_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/ranks_lib.sh"
MOE=(model.moe_d_ff=64 model.num_experts=4 model.moe_z_loss_coeff=0.001)
ARGS=("${ALIGN_ARGS[@]/model.preset=llama-tiny/model.preset=mixtral-tiny}" "${MOE[@]}")
LORA=(peft.method=lora peft.target_modules=all-linear peft.train_router=true)

run one "$NK" align "${ARGS[@]}"
run ep2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.ep=2
run ep2dp2 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.ep=2
run ep2tp2 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.ep=2 parallel.tp=2
run ep2pp2 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.ep=2 parallel.pp=2
run ep2zero1 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.ep=2 parallel.shard=optimizer
run ep2fsdp "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.ep=2 parallel.shard=full
grep -q "each rank holds and computes 2 of the 4 experts" "$WORK/ep2.log" ||
  fail "ep2 did not split the experts"
grep -q '"moe_aux"' "$WORK/one/metrics.jsonl" || fail "DPO on a MoE model logged no balancing loss"
compare one ep2 ep2dp2 ep2tp2 ep2pp2 ep2zero1 ep2fsdp ||
  fail "DPO under expert parallelism differs from one process"

run one_copy "$NK" align "${ARGS[@]}" align.reference=copy
run ep2_copy "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.reference=copy parallel.ep=2
KTO=(align.method=kto "align.data_path=$WORK/kto.jsonl" align.valid_path=)
run one_kto "$NK" align "${ARGS[@]}" "${KTO[@]}"
run ep2_kto "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" "${KTO[@]}" parallel.ep=2
compare one_copy ep2_copy && compare one_kto ep2_kto ||
  fail "a copy reference or KTO under expert parallelism differs from one process"
# A reward model (a score head over the MoE model, Bradley-Terry): under
# EP2 and EP2 x TP2; its export is HF's MixtralForSequenceClassification.
run one_rm "$NK" align "${ARGS[@]}" align.method=rm
run ep2_rm "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.method=rm parallel.ep=2
run ep2tp2_rm "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" align.method=rm parallel.ep=2 parallel.tp=2
compare one_rm ep2_rm ep2tp2_rm || fail "a MoE reward model under expert parallelism differs"
"$NK" export hf "$WORK/ep2_rm/model" "$WORK/rm_hf" >"$WORK/rm_hf.log" 2>&1 || fail "export hf of the RM"
grep -q '"MixtralForSequenceClassification"' "$WORK/rm_hf/config.json" ||
  fail "the MoE reward model's export is not MixtralForSequenceClassification"
# The balancing and z-losses in the objective: the ranks' MoE losses are
# their micro-batches' (each its rows' routing, all layers' on a pipeline's
# last stage), weighted as the language model's. (AdamW's eps 1e-6: at
# 1e-8 one element of layer 1's value weight, whose gradient is near zero,
# took updates from rounding-level remainders and ended 1.7e-5 apart under
# TP2 and EP2 x TP2 alike, the rest within 2.5e-6; at 1e-6 all within 5e-7.)
ML=(align.moe_losses=true model.moe_aux_loss_coeff=0.02 train.eps=1e-6)
run one_ml "$NK" align "${ARGS[@]}" "${ML[@]}"
run ep2_ml "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" "${ML[@]}" parallel.ep=2
run ep2dp2_ml "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" "${ML[@]}" parallel.ep=2
run ep2tp2_ml "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" "${ML[@]}" parallel.ep=2 parallel.tp=2
run ep2pp2_ml "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" "${ML[@]}" parallel.ep=2 parallel.pp=2
compare one_ml ep2_ml ep2dp2_ml ep2tp2_ml ep2pp2_ml ||
  fail "DPO with the MoE losses under expert parallelism differs from one process"
run one_ml_rm "$NK" align "${ARGS[@]}" "${ML[@]}" align.method=rm
run ep2_ml_rm "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" "${ML[@]}" align.method=rm parallel.ep=2
compare one_ml_rm ep2_ml_rm || fail "a reward model with the MoE losses under EP2 differs"
/usr/bin/python3 - "$WORK/one/metrics.jsonl" "$WORK/one_ml/metrics.jsonl" <<'PY' ||
import json, sys
off, on = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
# Both runs' first step reads the same weights: the losses differ by the
# balancing (coefficient 0.02) and z-losses (0.001) the step logged. (That
# their gradient moves the routers: AlignCli.MoeLossesJoinTheObjectiveWhenAsked;
# these two runs differ in AdamW's eps after the first step.)
want = off[0]["loss"] + 0.02 * on[0]["moe_aux"] + 0.001 * on[0]["moe_z"]
assert abs(on[0]["loss"] - want) < 1e-6, (on[0]["loss"], want)
PY
  fail "align.moe_losses=true did not add the MoE losses to DPO's"
run one_lora "$NK" align "${ARGS[@]}" "${LORA[@]}"
run ep2_lora "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" "${LORA[@]}" parallel.ep=2
compare_norm one_lora ep2_lora || fail "LoRA DPO under expert parallelism differs from one process"

# Online RL. The grader's rewards differ within each group, so every step
# has a policy gradient (with all completions alike GRPO's loss is 0 and the
# balancing losses alone move the weights, their rounding-level differences
# scaled up by Adam).
online_rl_data
GRPO=("${ONLINE_ARGS[@]/model.preset=llama-tiny/model.preset=mixtral-tiny}" "${MOE[@]}"
      align.method=grpo align.num_generations=4)
run one_grpo "$NK" align "${GRPO[@]}"
run ep2_grpo "${MPI[@]}" 2 "$NK" align "${GRPO[@]}" parallel.ep=2
run ep2dp2_grpo "${MPI[@]}" 4 "$NK" align "${GRPO[@]}" parallel.ep=2
run ep2tp2_grpo "${MPI[@]}" 4 "$NK" align "${GRPO[@]}" parallel.ep=2 parallel.tp=2
run ep2pp2_grpo "${MPI[@]}" 4 "$NK" align "${GRPO[@]}" parallel.ep=2 parallel.pp=2
# Under TP2 alone (the experts split over the tp ranks, or whole on each:
# parallel.etp=1) each round is generated from the split policy.
run tp2_grpo "${MPI[@]}" 2 "$NK" align "${GRPO[@]}" parallel.tp=2
run tp2etp1_grpo "${MPI[@]}" 2 "$NK" align "${GRPO[@]}" parallel.tp=2 parallel.etp=1
# DeepSeek-V3 (latent attention, shared and fine-grained experts, a dense
# first layer) likewise under TP2. Adam's epsilon 1e-4: with 1e-6 the steps
# where a group's completions are alike leave near-zero gradients whose
# rounding-level differences Adam scales up to 6.8e-5 in the weights (the
# completions and figures equal within 1e-7 either way).
DS=("${ONLINE_ARGS[@]/model.preset=llama-tiny/model.preset=deepseek_v3-tiny}" model.n_kv_head=4
    align.method=grpo align.num_generations=4 train.eps=1e-4)
run one_grpo_ds "$NK" align "${DS[@]}"
run tp2_grpo_ds "${MPI[@]}" 2 "$NK" align "${DS[@]}" parallel.tp=2
for r in tp2_grpo tp2etp1_grpo tp2_grpo_ds; do
  grep -q "each tensor-parallel group generates from its pieces" "$WORK/$r.log" ||
    fail "$r: the MoE policy was not generated from its tensor-parallel pieces"
done
compare one_grpo_ds tp2_grpo_ds || fail "DeepSeek-V3 GRPO under TP2 differs from one process"
grep -q '"rewards/command/std"' "$WORK/one_grpo/metrics.jsonl" || fail "GRPO logged no grader figures"
compare one_grpo ep2_grpo ep2dp2_grpo ep2tp2_grpo ep2pp2_grpo tp2_grpo tp2etp1_grpo ||
  fail "GRPO under expert or tensor parallelism differs from one process"
run one_grpo_ml "$NK" align "${GRPO[@]}" "${ML[@]}"
run ep2_grpo_ml "${MPI[@]}" 2 "$NK" align "${GRPO[@]}" "${ML[@]}" parallel.ep=2
run ep2tp2_grpo_ml "${MPI[@]}" 4 "$NK" align "${GRPO[@]}" "${ML[@]}" parallel.ep=2 parallel.tp=2
compare one_grpo_ml ep2_grpo_ml ep2tp2_grpo_ml ||
  fail "GRPO with the MoE losses under expert parallelism differs from one process"

# Stopped after step 3 (mid-way through round 1): the checkpoint and the
# round's file resume under EP2 and on one process to the whole run's numbers.
run part_grpo "${MPI[@]}" 2 "$NK" align "${GRPO[@]}" parallel.ep=2 train.exit_at_step=3
cp -r "$WORK/part_grpo" "$WORK/resumed_grpo_ep2"
cp -r "$WORK/part_grpo" "$WORK/resumed_grpo_one"
run resumed_grpo_ep2 "${MPI[@]}" 2 "$NK" align "${GRPO[@]}" parallel.ep=2
run resumed_grpo_one "$NK" align "${GRPO[@]}"
grep -q "round 1 read back" "$WORK/resumed_grpo_one.log" || fail "the resume did not read round 1 back"
compare one_grpo resumed_grpo_ep2 resumed_grpo_one ||
  fail "GRPO stopped under EP2 and resumed differs from the whole run"

run one_ppo "$NK" align "${GRPO[@]}" align.method=ppo
run ep2_ppo "${MPI[@]}" 2 "$NK" align "${GRPO[@]}" align.method=ppo parallel.ep=2
compare one_ppo ep2_ppo || fail "PPO under expert parallelism differs from one process"
# PPO with a critic of its own (the MoE reward model above, whole on every
# rank beside the split policy).
CRITIC=(align.method=ppo "align.value_model=$WORK/one_rm/model")
run one_ppo_critic "$NK" align "${GRPO[@]}" "${CRITIC[@]}"
run ep2_ppo_critic "${MPI[@]}" 2 "$NK" align "${GRPO[@]}" "${CRITIC[@]}" parallel.ep=2
run ep2tp2_ppo_critic "${MPI[@]}" 4 "$NK" align "${GRPO[@]}" "${CRITIC[@]}" parallel.ep=2 \
  parallel.tp=2
compare one_ppo_critic ep2_ppo_critic ep2tp2_ppo_critic ||
  fail "PPO with a critic of its own under expert parallelism differs from one process"
ADAPT=("${LORA[@]}" align.reference=adapter_off)
run one_grpo_lora "$NK" align "${GRPO[@]}" "${ADAPT[@]}"
run ep2_grpo_lora "${MPI[@]}" 2 "$NK" align "${GRPO[@]}" "${ADAPT[@]}" parallel.ep=2
compare_norm one_grpo_lora ep2_grpo_lora ||
  fail "LoRA GRPO under expert parallelism differs from one process"
# QLoRA GRPO under EP2: each round's whole policy over train.init_from's
# NF4 base read whole once, the adapters gathered.
QLORA_GRPO=("${GRPO[@]}" "${ADAPT[@]}" peft.method=qlora train.init_from="$WORK/one/model")
run one_grpo_qlora "$NK" align "${QLORA_GRPO[@]}"
run ep2_grpo_qlora "${MPI[@]}" 2 "$NK" align "${QLORA_GRPO[@]}" parallel.ep=2
compare_norm one_grpo_qlora ep2_grpo_qlora ||
  fail "QLoRA GRPO under expert parallelism differs from one process"
pass "align on a MoE model (DPO, copy reference, KTO, reward model, LoRA, the MoE losses in DPO and RM; GRPO with and without them, PPO (also with a critic of its own), LoRA and QLoRA GRPO, resumed) under EP2, EP2xDP2, EP2xTP2, EP2 with PP2, ZeRO-1 and FSDP, and GRPO under TP2 alone (generated from the split policy: experts split or whole, DeepSeek-V3), equals one process"
