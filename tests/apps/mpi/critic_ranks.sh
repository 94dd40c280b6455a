#!/usr/bin/env bash
# PPO with a critic of its own (`align.value_model`, TRL's value_model): a
# reward model trained here (`align.method=rm`) starts the critic (also as
# a Hugging Face folder, to the same run); PPO over
# 2 ranks (plain, ZeRO-1, ZeRO-2) equals one process (every step's loss and
# figures, the policy's and the critic's final weights within 1e-5:
# compare_runs.py reads OUT/critic/model too); a run
# stopped after step 3 (mid-way through round 1) resumes the critic from
# its checkpoint of that step to the same figures and weights (also into
# another OUT_DIR through train.resume_from). A critic
# started from a causal LM (the fine-tuned policy itself) gains a score head
# and is exported as a one-label classifier. With the policy in pieces (TP2,
# TP2 SP, FSDP, PP2, CP2, TP2 x DP2 ZeRO-1, PP2 x TP2) the critic is whole on
# every rank, the same run; stopped under TP2, resumed under TP2 and on one
# process. Refused, naming the key and leaving no OUT_DIR: a method without
# a critic, a folder that is not a model, a critic of
# another vocabulary; a resume whose critic checkpoint is gone names its
# folder.
#   tests/apps/mpi/critic_ranks.sh REPO BUILD
set -euo pipefail
NAME=critic_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/ranks_lib.sh"
cleanup() { if [[ -n ${KEEP:-} ]]; then rm -rf "$KEEP"; cp -r "$WORK" "$KEEP"; fi; }
online_rl_data

# The reward model: a score head trained on the preference pairs.
run rm "$NK" align "${ALIGN_ARGS[@]}" align.method=rm train.steps=4 train.val_every=0
grep -q '"num_labels": 1' "$WORK/rm/model/config.json" || fail "the reward model has no score head"

PPO=("${ONLINE_ARGS[@]}" align.method=ppo align.num_generations=2 align.whiten_rewards=true
     align.gamma=0.95 train.val_every=0 "align.value_model=$WORK/rm/model")
run one "$NK" align "${PPO[@]}"
grep -q "critic = .*a reward model's score head" "$WORK/one.log" || fail "no critic was loaded"
grep -q '"loss/value"' "$WORK/one/metrics.jsonl" || fail "PPO logged no value loss"
grep -q '"value_head"' "$WORK/one/model/config.json" && fail "the policy gained a value head"
grep -q '"num_labels": 1' "$WORK/one/critic/model/config.json" || fail "no critic exported"
# The same reward model as a Hugging Face folder (LlamaForSequenceClassification,
# f32): imported into a temporary folder for the load, the same run.
"$NK" export hf "$WORK/rm/model" "$WORK/rm_hf" --dtype f32 >"$WORK/rm_hf.log" 2>&1 ||
  fail "export hf of the reward model"
run one_hf "$NK" align "${PPO[@]}" "align.value_model=$WORK/rm_hf"
compare one one_hf || fail "a critic from the Hugging Face folder differs from the Nekton one"
run dp2 "${MPI[@]}" 2 "$NK" align "${PPO[@]}"
run zero1 "${MPI[@]}" 2 "$NK" align "${PPO[@]}" parallel.shard=optimizer
run zero2 "${MPI[@]}" 2 "$NK" align "${PPO[@]}" parallel.shard=grads
grep -q "data parallel: world 2" "$WORK/dp2.log" || fail "dp2 did not run data parallel"
compare one dp2 zero1 zero2 || fail "PPO with a critic: data parallel differs from one process"
# The policy in pieces, the critic whole on every rank: its gradients are
# the rows' of tp rank 0 of the last stage (each cp rank its own positions
# of whole rows), summed over every rank.
run tp2 "${MPI[@]}" 2 "$NK" align "${PPO[@]}" parallel.tp=2
run tp2sp "${MPI[@]}" 2 "$NK" align "${PPO[@]}" parallel.tp=2 parallel.sp=true
run fsdp "${MPI[@]}" 2 "$NK" align "${PPO[@]}" parallel.shard=full
run pp2 "${MPI[@]}" 2 "$NK" align "${PPO[@]}" parallel.pp=2
run cp2 "${MPI[@]}" 2 "$NK" align "${PPO[@]}" parallel.cp=2
run tp2dp2 "${MPI[@]}" 4 "$NK" align "${PPO[@]}" parallel.tp=2 parallel.shard=optimizer
run pp2tp2 "${MPI[@]}" 4 "$NK" align "${PPO[@]}" parallel.pp=2 parallel.tp=2
grep -q "model parallel: .*tp 2" "$WORK/tp2.log" || fail "tp2 did not split the policy"
compare one tp2 tp2sp fsdp pp2 cp2 tp2dp2 pp2tp2 ||
  fail "PPO with a critic: TP2, TP2 SP, FSDP, PP2, CP2, TP2 x DP2 or PP2 x TP2 differs from one process"
# Stopped under TP2 after step 3: every rank reads the critic's checkpoint,
# resumed under TP2 and on one process.
run part_tp2 "${MPI[@]}" 2 "$NK" align "${PPO[@]}" parallel.tp=2 train.exit_at_step=3
for to in resumed_tp2 resumed_tp2_one; do cp -r "$WORK/part_tp2" "$WORK/$to"; done
run resumed_tp2 "${MPI[@]}" 2 "$NK" align "${PPO[@]}" parallel.tp=2
run resumed_tp2_one "$NK" align "${PPO[@]}"
grep -q "the critic resumed from" "$WORK/resumed_tp2.log" || fail "the critic was not resumed"
compare one resumed_tp2 resumed_tp2_one || fail "PPO with a critic stopped under TP2 and resumed differs"

# Stopped after step 3 (mid-way through round 1): the critic's checkpoint of
# step 3 is written beside the policy's and read back.
run part "$NK" align "${PPO[@]}" train.exit_at_step=3
ls "$WORK/part/critic/checkpoints/step_00000003" >/dev/null || fail "no critic checkpoint at step 3"
for to in resumed lost; do cp -r "$WORK/part" "$WORK/$to"; done
run resumed "$NK" align "${PPO[@]}"
grep -q "the critic resumed from" "$WORK/resumed.log" || fail "the critic was not resumed"
compare one resumed || fail "PPO with a critic, resumed, differs from the whole run"
# Into another OUT_DIR through train.resume_from (the run's folder, then
# its checkpoint folder): the critic's checkpoint and the round's file read
# from beside it.
run elsewhere "$NK" align "${PPO[@]}" "train.resume_from=$WORK/part"
run elsewhere_ckpt "$NK" align "${PPO[@]}" \
  "train.resume_from=$WORK/part/checkpoints/step_00000003"
# (Their metrics start at step 4: the steps before are the stopped run's.)
with_steps_of() {
  cat "$WORK/$1/metrics.jsonl" "$WORK/$2/metrics.jsonl" >"$WORK/$2/all.jsonl"
  mv "$WORK/$2/all.jsonl" "$WORK/$2/metrics.jsonl"
}
with_steps_of part elsewhere
with_steps_of part elsewhere_ckpt
compare one elsewhere elsewhere_ckpt || fail "PPO with a critic resumed from another folder differs"
# Rounds of 3 steps: stopped at step 4, resumed into another OUT_DIR and
# stopped again at step 5 (mid-way through the same round: the round's file
# copied there), then resumed from that folder alone to the end.
PPO3=("${PPO[@]}" align.ppo_epochs=3)
run one3 "$NK" align "${PPO3[@]}"
run part3 "$NK" align "${PPO3[@]}" train.exit_at_step=4
run moved3 "$NK" align "${PPO3[@]}" "train.resume_from=$WORK/part3" train.exit_at_step=5
ls "$WORK/moved3/rollouts/round-1.rank-0.bin" >/dev/null ||
  fail "the round read from train.resume_from's run was not copied into the new OUT_DIR"
run moved3 "$NK" align "${PPO3[@]}"
with_steps_of part3 moved3
compare one3 moved3 || fail "PPO resumed twice through another OUT_DIR differs from the whole run"
rm -rf "$WORK/lost/critic/checkpoints"
refused lost "needs the critic's checkpoint of that step" "$NK" align "${PPO[@]}"

# A critic from a causal LM: the fine-tuned policy's own trunk with a score
# head drawn from the seed.
run sft "$NK" finetune "${SFT_ARGS[@]}" train.steps=2 train.val_every=0
FROM_LM=("${PPO[@]}" "train.init_from=$WORK/sft/model" "align.value_model=$WORK/sft/model")
run lm_one "$NK" align "${FROM_LM[@]}"
grep -q "a causal LM's trunk with a new score head" "$WORK/lm_one.log" ||
  fail "the causal LM was not taken as the critic's trunk"
grep -q '"num_labels": 1' "$WORK/lm_one/critic/model/config.json" || fail "no classifier exported"
run lm_dp2 "${MPI[@]}" 2 "$NK" align "${FROM_LM[@]}"
compare lm_one lm_dp2 || fail "PPO with a critic from a causal LM: DP2 differs from one process"

# Refusals, before anything is written.
refused_clean() {
  local out=$1
  refused "$@"
  [[ ! -e "$WORK/$out" ]] || fail "$out: a refused run left $WORK/$out"
}
refused_clean grpo "align.value_model: PPO's critic" "$NK" align "${PPO[@]}" align.method=grpo
refused_clean nofolder "is not a model folder" "$NK" align "${PPO[@]}" \
  "align.value_model=$WORK/prompts.jsonl"
run rm300 "$NK" align "${ALIGN_ARGS[@]}" align.method=rm train.steps=1 train.val_every=0 \
  model.vocab_size=300
refused_clean vocab "has a vocabulary of 300 ids, the policy one of 264" "$NK" align "${PPO[@]}" \
  "align.value_model=$WORK/rm300/model"
pass "PPO with a critic of its own (from a reward model, and from a causal LM) under DP2, ZeRO-1, ZeRO-2, TP2, TP2 SP, FSDP, PP2, CP2, TP2 x DP2 and PP2 x TP2, and resumed mid-round, equals one process, policy and critic; bad critics refused"
