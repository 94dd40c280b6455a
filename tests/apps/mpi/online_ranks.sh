#!/usr/bin/env bash
# Online RL (`nekton align align.method=grpo`, issue 38) under data
# parallelism equals one process: each rank generates its share of a round's
# completions (seeded per prompt and generation, so the same ones), scores
# them with the reward functions (a length penalty and a command grader run
# by every rank) and the ranks sum the round in; the advantages, every
# step's loss and figures and the exported weights within 1e-5 of one
# process (f32), 6 steps of two-step rounds (align.ppo_epochs=2: old
# log-probabilities from the round's policy) with a frozen-copy reference
# for the KL. ZeRO-1, ZeRO-2 and `--nproc 2` too. A run stopped after step 3
# (mid-way through round 1) resumes from its checkpoint and the round's file
# to the same figures and weights (also from DP2 to one process and back;
# a replica's round file lost is refused), as does one resumed after its command
# grader crashed (an error naming it; the last checkpoint stands); RLOO over
# 2 ranks; PPO over 2 ranks and resumed mid-round. With the model in pieces
# (the policy gathered whole for each round, or under TP alone each tp group
# generating from its pieces): GRPO under TP2, FSDP, PP2,
# DP2 x TP2 ZeRO-1 and PP2 x DP2 FSDP, stopped under TP2 and resumed under
# TP2 and on one process, RLOO under TP2, PPO under PP2, FSDP, TP2 and TP2
# SP (also from a causal LM, its value head added), GRPO under CP2 and CP2 x
# DP2 and CP2 x PP2 and PPO under CP2 equal one process; a validation pass
# (align.valid_path) leaves the training as it is and logs the same
# figures under DP2 and TP2.
#   tests/apps/mpi/online_ranks.sh REPO BUILD
set -euo pipefail
NAME=online_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/ranks_lib.sh"
cleanup() { if [[ -n ${KEEP:-} ]]; then rm -rf "$KEEP"; cp -r "$WORK" "$KEEP"; fi; }
online_rl_data
ARGS=("${ONLINE_ARGS[@]}" align.method=grpo align.num_generations=4)
run one "$NK" align "${ARGS[@]}"
run dp2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}"
run zero1 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.shard=optimizer
run zero2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.shard=grads
run nproc2 "$NK" align --nproc 2 "${ARGS[@]}"
grep -q "data parallel: world 2" "$WORK/dp2.log" || fail "dp2 did not run data parallel"
grep -q '"clip_ratio/region_mean"' "$WORK/one/metrics.jsonl" || fail "no clip figures logged"
compare one dp2 zero1 zero2 nproc2 || fail "a data-parallel GRPO run differs from one process"

# Stopped after step 3, mid-way through round 1 (steps 3-4): resumed from the
# checkpoint and the round's rollouts file, it ends where the whole run did.
run part "$NK" align "${ARGS[@]}" train.exit_at_step=3
ls "$WORK/part/rollouts/round-1.rank-0.bin" >/dev/null || fail "no round file for round 1"
# The checkpoint of step 3 is round 1's: round 0's file is no longer needed.
[[ ! -e "$WORK/part/rollouts/round-0.rank-0.bin" ]] || fail "round 0's file outlived the checkpoint"
cp -r "$WORK/part" "$WORK/resumed"
run resumed "$NK" align "${ARGS[@]}"
grep -q "round 1 read back" "$WORK/resumed.log" || fail "the resume did not read round 1 back"
compare one resumed || fail "the resumed GRPO run differs from the whole one"
# On another number of replicas: stopped under DP2 and resumed on one
# process (each replica's round file holds its own samples' old
# log-probabilities, so every file of the round is read), stopped on one
# process and resumed under DP2. A replica's file lost is an error naming
# the round's files.
run part_dp2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" train.exit_at_step=3
for to in resumed_dp2_one lost_dp2; do cp -r "$WORK/part_dp2" "$WORK/$to"; done
cp -r "$WORK/part" "$WORK/resumed_one_dp2"
run resumed_dp2_one "$NK" align "${ARGS[@]}"
run resumed_one_dp2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}"
grep -q "round-1.rank-0.bin, .*round-1.rank-1.bin" "$WORK/resumed_dp2_one.log" ||
  fail "the resume on one process did not read both replicas' round files"
compare one resumed_dp2_one resumed_one_dp2 ||
  fail "GRPO resumed on another number of replicas differs from the whole run"
rm "$WORK/lost_dp2/rollouts/round-1.rank-1.bin"
refused lost_dp2 "round 1's files hold no per-token values for its sample" "$NK" align "${ARGS[@]}"

run one_rloo "$NK" align "${ARGS[@]}" align.method=rloo
run dp2_rloo "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.method=rloo
compare one_rloo dp2_rloo || fail "RLOO: data parallel differs from one process"

# PPO (a value head, GAE, whitening over the round): 2 ranks equal one
# process, and a run stopped mid-round resumes from the round's file (the
# values, advantages and returns in it) to the same numbers.
PPO=("${ARGS[@]}" align.method=ppo align.whiten_rewards=true align.gamma=0.95)
run one_ppo "$NK" align "${PPO[@]}"
grep -q '"loss/value"' "$WORK/one_ppo/metrics.jsonl" || fail "PPO logged no value loss"
grep -q '"value_head": true' "$WORK/one_ppo/model/config.json" || fail "PPO's model has no value head"
run dp2_ppo "${MPI[@]}" 2 "$NK" align "${PPO[@]}"
run part_ppo "$NK" align "${PPO[@]}" train.exit_at_step=3
cp -r "$WORK/part_ppo" "$WORK/resumed_ppo"
run resumed_ppo "$NK" align "${PPO[@]}"
grep -q "round 1 read back" "$WORK/resumed_ppo.log" || fail "the PPO resume did not read round 1 back"
compare one_ppo dp2_ppo resumed_ppo || fail "PPO: data parallel or a resumed run differs from one process"

# A grader that crashes in round 2 (its 3rd call) stops the run with an error
# naming the command and its exit status; the checkpoint of step 4 stands and
# a rerun with a working grader resumes from it to the whole run's numbers.
cat >"$WORK/flaky.sh" <<SH
#!/bin/sh
n=\$(cat "$WORK/calls" 2>/dev/null || echo 0); echo \$((n + 1)) >"$WORK/calls"
if [ "\$n" = 2 ]; then echo "grader broke" >&2; exit 7; fi
exec /usr/bin/python3 "$WORK/grader.py"
SH
chmod +x "$WORK/flaky.sh"
if timeout 120 "$NK" align "${ARGS[@]}" "align.reward_command=$WORK/flaky.sh" train.save_every=2 \
  train.out_dir="$WORK/flaky" >"$WORK/flaky.log" 2>&1; then
  fail "a crashing grader did not stop the run"
fi
grep -q "flaky.sh" "$WORK/flaky.log" && grep -q "grader broke" "$WORK/flaky.log" ||
  fail "the error does not name the grader and its stderr"
ls -d "$WORK/flaky/checkpoints/step_00000004" >/dev/null || fail "the step-4 checkpoint is gone"
run flaky "$NK" align "${ARGS[@]}" train.save_every=2
compare one flaky || fail "the run resumed after the grader's crash differs from the whole one"

# A model in pieces (pipeline parallel, FSDP): each round's policy
# gathered whole on every rank, which share the generations (k % world) and
# the replica's log-probabilities; split by tensor parallelism alone (TP2,
# DP2 x TP2): each tp group generates its replica's share from its pieces
# (the cached decode under TP) and computes the log-probabilities with the
# live split model, no whole copy; the training steps split as the layout
# splits them. (AdamW's eps is 1e-6 in these runs: each group's advantages
# sum to zero, so a shared prompt's contributions nearly cancel in a few
# gradient elements, whose rounding-level remainders eps 1e-8 would turn
# into whole steps of lr under tensor parallelism's other order of sums:
# 13 of 108k elements 1e-6 to 1.5e-4 apart after one step, the rest 2e-7.)
run tp2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.tp=2
run fsdp "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.shard=full
run pp2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.pp=2
run dp2tp2 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.tp=2 parallel.shard=optimizer
run pp2dp2 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.pp=2 parallel.shard=full
for r in fsdp pp2 pp2dp2; do
  grep -q '"gather_policy_s"' "$WORK/$r/metrics.jsonl" || fail "$r: no gathered policy logged"
done
for r in tp2 dp2tp2; do
  grep -q "each tensor-parallel group generates from its pieces" "$WORK/$r.log" &&
    ! grep -q '"gather_policy_s"' "$WORK/$r/metrics.jsonl" ||
    fail "$r: the policy was gathered whole, not decoded in its pieces"
done
grep -q '"clip_ratio/region_mean"' "$WORK/pp2/metrics.jsonl" || fail "pp2: no clip figures logged"
compare one tp2 fsdp pp2 dp2tp2 pp2dp2 ||
  fail "GRPO under TP2, FSDP, PP2, DP2xTP2 ZeRO-1 or PP2xDP2 FSDP differs from one process"
# A validation pass (align.valid_path, every 3 steps): each validation
# prompt's completions from the live weights (gathered whole where the model
# is in pieces), scored and logged as val_*; the training is the run's
# without it, and the figures are the same under DP2 ZeRO-1 and TP2.
head -n 6 "$WORK/prompts.jsonl" >"$WORK/valid.jsonl"
VAL=("align.valid_path=$WORK/valid.jsonl" train.val_every=3)
run one_val "$NK" align "${ARGS[@]}" "${VAL[@]}"
run dp2_val "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" "${VAL[@]}" parallel.shard=optimizer
run tp2_val "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" "${VAL[@]}" parallel.tp=2
/usr/bin/python3 - "$WORK/one_val/metrics.jsonl" <<'PY' || fail "no validation figures at steps 3 and 6"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
at = [r["step"] for r in rows if "val_reward" in r]
assert at == [3, 6], at
for r in rows:
    if "val_reward" in r:
        for k in ("val_rewards/command/mean", "val_rewards/length/mean", "val_completions/mean_length"):
            assert k in r, (r["step"], k)
PY
grep -q "validation on 6 prompts x 4" "$WORK/one_val.log" || fail "the validation did not log its prompts"
compare one one_val || fail "a validation pass changed the training"
compare one_val dp2_val tp2_val || fail "the validation figures differ under DP2 or TP2"
# A validation record without its prompt: refused naming the file and line,
# before anything is written.
{ head -n 1 "$WORK/valid.jsonl"; echo '{"question": "say x:"}'; } >"$WORK/valid_bad.jsonl"
refused val_bad "valid_bad.jsonl:2" "$NK" align "${ARGS[@]}" "align.valid_path=$WORK/valid_bad.jsonl"
[[ ! -e "$WORK/val_bad" ]] || fail "a refused validation file left a run folder"
# Stopped mid-round under TP2: one round file per replica, read back by
# TP2 and by one process.
run part_tp2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.tp=2 train.exit_at_step=3
ls "$WORK/part_tp2/rollouts/round-1.rank-0.bin" >/dev/null || fail "tp2: no round file for round 1"
cp -r "$WORK/part_tp2" "$WORK/resumed_tp2"
cp -r "$WORK/part_tp2" "$WORK/resumed_tp2_one"
run resumed_tp2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.tp=2
run resumed_tp2_one "$NK" align "${ARGS[@]}"
grep -q "round 1 read back" "$WORK/resumed_tp2_one.log" || fail "the TP2 round file was not read back"
compare one resumed_tp2 resumed_tp2_one || fail "GRPO stopped under TP2 and resumed differs"
run tp2_rloo "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.method=rloo parallel.tp=2
compare one_rloo tp2_rloo || fail "RLOO: TP2 differs from one process"
run pp2_ppo "${MPI[@]}" 2 "$NK" align "${PPO[@]}" parallel.pp=2
run fsdp_ppo "${MPI[@]}" 2 "$NK" align "${PPO[@]}" parallel.shard=full
run tp2_ppo "${MPI[@]}" 2 "$NK" align "${PPO[@]}" parallel.tp=2
compare one_ppo pp2_ppo fsdp_ppo tp2_ppo || fail "PPO: PP2, FSDP or TP2 differs from one process"
# PPO from a causal LM (GRPO's result): the value head it gains drawn from
# the seed on the last stage (whole on every tp rank), as on one process.
INIT=("${PPO[@]}" "train.init_from=$WORK/one/model")
run one_ppo_init "$NK" align "${INIT[@]}"
run tp2_ppo_init "${MPI[@]}" 2 "$NK" align "${INIT[@]}" parallel.tp=2
run pp2_ppo_init "${MPI[@]}" 2 "$NK" align "${INIT[@]}" parallel.pp=2
compare one_ppo_init tp2_ppo_init pp2_ppo_init ||
  fail "PPO from a causal LM: TP2 or PP2 differs from one process"

# Under sequence parallelism the value head reads the final norm's rows
# gathered (every rank computes every value), each rank adding its own
# rows' gradient.
run tp2sp_ppo "${MPI[@]}" 2 "$NK" align "${PPO[@]}" parallel.tp=2 parallel.sp=true
compare one_ppo tp2sp_ppo || fail "PPO under TP2 SP differs from one process"
# Context parallel: each rank trains the tokens of its chunks of the rows
# (the terms are per token; the cp ranks' sums make the loss and gradient).
run cp2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.cp=2
run cp2dp2 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.cp=2 parallel.cp_comm_type=a2a
run cp2_ppo "${MPI[@]}" 2 "$NK" align "${PPO[@]}" parallel.cp=2
run cp2pp2 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.cp=2 parallel.pp=2
compare one cp2 cp2dp2 cp2pp2 || fail "GRPO under CP2, CP2xDP2 or CP2xPP2 differs from one process"
compare one_ppo cp2_ppo || fail "PPO under CP2 differs from one process"
pass "align.method=grpo under DP (2 ranks), ZeRO-1 and --nproc 2, resumed mid-round or after a grader crash, RLOO under DP2, and PPO under DP2 and resumed mid-round equal one process; GRPO under TP2, FSDP, PP2, DP2xTP2 and PP2xDP2 FSDP, resumed from TP2, RLOO under TP2, PPO under PP2, FSDP and TP2 (from scratch and from a causal LM), GRPO under CP2, CP2xDP2 and CP2xPP2, PPO under CP2 too; a validation pass leaves the training alone, alike under DP2 and TP2"
