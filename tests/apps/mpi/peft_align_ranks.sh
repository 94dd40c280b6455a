#!/usr/bin/env bash
# `nekton align` with PEFT adapters over several processes equals one
# process: from a saved base (train.init_from), 10 steps, f32. DPO with LoRA
# and align.reference=adapter_off (the policy with its adapters off: under
# data parallelism a staged forward of its own before the policy's) under
# plain data parallelism over 2 and 4 ranks, ZeRO-1 and FSDP; QLoRA DPO under
# DP2 and FSDP; KTO with IA3 (adapter_off) under ZeRO-1; DPO with LoRA and
# align.reference=precompute under DP2. Every step's loss, validation loss and
# TRL figures, the exported model and the PEFT adapter within 1e-5 of one
# process; LoRA DPO under TP2, and with SP, and QLoRA DPO under TP2, too
# (the weights per tensor within 1e-4).
# Pipeline parallel: LoRA and QLoRA DPO with the precomputed reference under
# PP2 and PP2xDP2 FSDP, LoRA DPO and IA3 KTO with adapter_off (the reference
# forward through the stages) under PP2 (and PP2xDP2 FSDP), within 1e-5.
# LoRA DPO (adapter_off) under CP2 within 1e-5. LoRA GRPO (adapter_off) under
# TP2 (each tp group generating from its pieces) and PP2 (the policy
# gathered whole for each round) within 1e-4 per tensor; QLoRA GRPO under
# FSDP, CP2, PP2 (its whole policy over train.init_from's NF4 base read
# whole) and TP2 (from its NF4 shares) within 1e-4 per tensor.
#   tests/apps/mpi/peft_align_ranks.sh REPO BUILD
set -euo pipefail
NAME=peft_align_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/ranks_lib.sh"

run base "$NK" finetune "${SFT_ARGS[@]}" train.steps=3
ARGS=("${ALIGN_ARGS[@]}" train.init_from="$WORK/base/model" train.lr=1e-2)

run one_lora "$NK" align "${ARGS[@]}" peft.method=lora
run dp2_lora "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" peft.method=lora
run dp4_lora "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" peft.method=lora
run zero1_lora "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" peft.method=lora parallel.shard=optimizer
run fsdp_lora "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" peft.method=lora parallel.shard=full
for r in one dp2; do
  grep -q "align: reference = the policy with its adapters switched off" "$WORK/${r}_lora.log" ||
    fail "${r}_lora: the reference is not the policy with its adapters off"
done
grep -q "data parallel: world 2" "$WORK/dp2_lora.log" || fail "dp2_lora did not run data parallel"
compare one_lora dp2_lora dp4_lora zero1_lora fsdp_lora ||
  fail "LoRA DPO (adapter_off): a parallel run differs from one process"

run one_qlora "$NK" align "${ARGS[@]}" peft.method=qlora
run dp2_qlora "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" peft.method=qlora
run fsdp_qlora "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" peft.method=qlora parallel.shard=full
KTO=(align.method=kto align.data_path="$WORK/kto.jsonl" align.valid_path= peft.method=ia3)
run one_kto "$NK" align "${ARGS[@]}" "${KTO[@]}"
run zero1_kto "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" "${KTO[@]}" parallel.shard=optimizer
run one_pre "$NK" align "${ARGS[@]}" peft.method=lora align.reference=precompute
run dp2_pre "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" peft.method=lora align.reference=precompute
compare one_qlora dp2_qlora fsdp_qlora && compare one_kto zero1_kto &&
  compare one_pre dp2_pre || fail "QLoRA DPO, IA3 KTO or a precomputed reference: a parallel run differs"
cmp -s "$WORK/one_pre/reference_logps.json" "$WORK/dp2_pre/reference_logps.json" ||
  fail "dp2_pre: reference_logps.json differs from one process's"

# Tensor parallel: the adapters split as their layers (the ranks' other
# order of sums: weights per tensor).
run tp2_lora "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" peft.method=lora parallel.tp=2
grep -q "align: reference = the policy with its adapters switched off" "$WORK/tp2_lora.log" ||
  fail "tp2_lora: the reference is not the policy with its adapters off"
run tp2sp_lora "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" peft.method=lora parallel.tp=2 \
  parallel.sp=true
compare_norm one_lora tp2_lora tp2sp_lora ||
  fail "LoRA DPO (adapter_off): TP2 (or with SP) differs from one process"
# QLoRA DPO under TP2: each rank's NF4 share cut from the whole tensor's
# blocks (a base 128 wide, so a row-parallel share is whole blocks).
WIDE=(model.d_model=128 model.d_ff=256)
run base_wide "$NK" finetune "${SFT_ARGS[@]}" "${WIDE[@]}" train.steps=3
QWIDE=("${ALIGN_ARGS[@]}" "${WIDE[@]}" train.init_from="$WORK/base_wide/model" train.lr=1e-2
       peft.method=qlora)
run one_qwide "$NK" align "${QWIDE[@]}"
run tp2_qlora "${MPI[@]}" 2 "$NK" align "${QWIDE[@]}" parallel.tp=2
compare_norm one_qwide tp2_qlora || fail "QLoRA DPO (adapter_off): TP2 differs from one process"
# Context parallel: the reference forward with the adapters off over the
# ranks' chunks, the rows' sums over the cp ranks.
run cp2_lora "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" peft.method=lora parallel.cp=2
compare one_lora cp2_lora || fail "LoRA DPO (adapter_off): CP2 differs from one process"

# Pipeline parallel: the reference precomputed through the stages.
run pp2_pre "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" peft.method=lora align.reference=precompute \
  parallel.pp=2
run pp2fsdp_pre "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" peft.method=lora \
  align.reference=precompute parallel.pp=2 parallel.shard=full
run pp2_qlora "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" peft.method=qlora \
  align.reference=precompute parallel.pp=2
run one_qpre "$NK" align "${ARGS[@]}" peft.method=qlora align.reference=precompute
compare one_pre pp2_pre pp2fsdp_pre || fail "LoRA DPO (precompute): PP2 differs from one process"
compare one_qpre pp2_qlora || fail "QLoRA DPO (precompute): PP2 differs from one process"
# adapter_off (auto's choice with adapters) through the pipeline: each
# micro-batch's forward with the adapters off through the stages before the
# step's schedule.
run pp2_lora "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" peft.method=lora parallel.pp=2
run pp2fsdp_lora "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" peft.method=lora parallel.pp=2 \
  parallel.shard=full
run pp2_kto "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" "${KTO[@]}" parallel.pp=2
grep -q "align: reference = the policy with its adapters switched off" "$WORK/pp2_lora.log" ||
  fail "pp2_lora: the reference is not the policy with its adapters off"
compare one_lora pp2_lora pp2fsdp_lora ||
  fail "LoRA DPO (adapter_off): PP2 or PP2 x DP2 FSDP differs from one process"
compare one_kto pp2_kto || fail "IA3 KTO (adapter_off): PP2 differs from one process"

# Online RL with a LoRA policy (reference: its adapters off) where the model
# is in pieces: under PP2 the policy gathered whole on every rank, the
# frozen base once and the adapters each round; under TP2 each tp group
# generates from its pieces, adapters included (a grader that scores
# distinct letters, so groups differ).
printf '%s\n' 'import json, sys' 'for line in sys.stdin:' \
  '    print(len(set(json.loads(line)["completion"])) / 10.0)' >"$WORK/grader.py"
GRPO=("${ARGS[@]}" peft.method=lora align.method=grpo align.valid_path= align.max_prompt_length=12
      align.max_tokens=8 align.num_generations=4 align.ppo_epochs=2 align.kl_coef=0.05
      align.reward_funcs=command "align.reward_command=/usr/bin/python3 $WORK/grader.py"
      train.steps=6 align.temperature=1.2 train.eps=1e-6)  # eps: see online_ranks.sh
run one_grpo "$NK" align "${GRPO[@]}"
run tp2_grpo "${MPI[@]}" 2 "$NK" align "${GRPO[@]}" parallel.tp=2
run pp2_grpo "${MPI[@]}" 2 "$NK" align "${GRPO[@]}" parallel.pp=2
grep -q "align: reference = the policy with its adapters switched off" "$WORK/tp2_grpo.log" ||
  fail "tp2_grpo: the reference is not the policy with its adapters off"
grep -q "is kept for the next rounds, which gather its" "$WORK/pp2_grpo.log" ||
  fail "pp2_grpo: the gathered frozen base is not kept between rounds"
grep -q "each tensor-parallel group generates from its pieces" "$WORK/tp2_grpo.log" ||
  fail "tp2_grpo: the policy was gathered whole, not decoded in its pieces"
compare_norm one_grpo tp2_grpo pp2_grpo || fail "LoRA GRPO: TP2 or PP2 differs from one process"
# QLoRA GRPO: the rounds' whole policy is train.init_from's NF4 base, read
# whole once (as one process quantises it), the adapters gathered each round.
run one_qgrpo "$NK" align "${GRPO[@]}" peft.method=qlora
run fsdp_qgrpo "${MPI[@]}" 2 "$NK" align "${GRPO[@]}" peft.method=qlora parallel.shard=full
run cp2_qgrpo "${MPI[@]}" 2 "$NK" align "${GRPO[@]}" peft.method=qlora parallel.cp=2
run pp2_qgrpo "${MPI[@]}" 2 "$NK" align "${GRPO[@]}" peft.method=qlora parallel.pp=2
QGRPO_WIDE=("${GRPO[@]}" "${WIDE[@]}" train.init_from="$WORK/base_wide/model" peft.method=qlora)
run one_qgrpo_wide "$NK" align "${QGRPO_WIDE[@]}"
run tp2_qgrpo "${MPI[@]}" 2 "$NK" align "${QGRPO_WIDE[@]}" parallel.tp=2
grep -q "NF4 (QLoRA)" "$WORK/tp2_qgrpo.log" || fail "tp2_qgrpo did not hold an NF4 base"
compare_norm one_qgrpo fsdp_qgrpo cp2_qgrpo pp2_qgrpo && compare_norm one_qgrpo_wide tp2_qgrpo ||
  fail "QLoRA GRPO: FSDP, CP2, PP2 or TP2 differs from one process"
pass "align with LoRA (adapter_off, precompute), QLoRA and IA3 (KTO) under DP (2, 4 ranks), ZeRO-1 and FSDP, LoRA DPO under TP2 (and SP) and CP2, QLoRA DPO under TP2, and LoRA and QLoRA DPO (precompute) under PP2 and PP2xDP2 FSDP, LoRA GRPO under TP2 and PP2, QLoRA GRPO under FSDP, CP2, PP2 and TP2, equals one process"
