#!/usr/bin/env bash
# PEFT adapters fine-tuned over several processes equal one process: from a
# saved base (train.init_from), 10 steps of packed SFT rows, f32. LoRA (with
# dropout: each micro-batch draws one process's mask) under plain data
# parallelism over 2 and 4 ranks, ZeRO-1 and FSDP; QLoRA (an NF4 base) under
# DP2, ZeRO-1 and FSDP, and FSDP stopped at step 5 and resumed; IA3 under DP2
# and FSDP; bottleneck adapters under ZeRO-1; p-tuning (unpacked rows) under
# DP2 and FSDP; `nekton train` with LoRA under FSDP; LoRA (no dropout),
# QLoRA, IA3 and bottleneck adapters under context parallelism (CP2). Every
# step's loss, the validation loss, the exported model and the PEFT adapter
# (adapter/adapter_model.safetensors) within 1e-5 of one process. LoRA
# dropout under CP is refused, naming peft.lora_dropout. (Adapters under
# tensor and pipeline parallelism: peft_model_parallel_ranks.sh.)
#   tests/apps/mpi/peft_finetune_ranks.sh REPO BUILD
set -euo pipefail
NAME=peft_finetune_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/ranks_lib.sh"

run base "$NK" finetune "${SFT_ARGS[@]}" train.steps=3
# A higher learning rate: the adapters start at (or near) the identity.
ARGS=("${SFT_ARGS[@]}" train.init_from="$WORK/base/model" train.lr=1e-2)

LORA=(peft.method=lora peft.lora_dropout=0.1)
run one_lora "$NK" finetune "${ARGS[@]}" "${LORA[@]}"
run dp2_lora "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" "${LORA[@]}"
run dp4_lora "${MPI[@]}" 4 "$NK" finetune "${ARGS[@]}" "${LORA[@]}"
run zero1_lora "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" "${LORA[@]}" parallel.shard=optimizer
run fsdp_lora "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" "${LORA[@]}" parallel.shard=full
grep -q "data parallel: world 2" "$WORK/dp2_lora.log" || fail "dp2_lora did not run data parallel"
grep -q "peft: LoRA" "$WORK/dp2_lora.log" || fail "dp2_lora did not train LoRA"
compare one_lora dp2_lora dp4_lora zero1_lora fsdp_lora || fail "LoRA: a parallel run differs"
# Context parallel: LoRA without dropout (with it each rank would draw the
# masks of its own chunks: refused), QLoRA, IA3 and bottleneck adapters.
run one_lora_cp "$NK" finetune "${ARGS[@]}" peft.method=lora
run cp2_lora "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=lora parallel.cp=2
# (The ring adds attention's terms in another order: weights per tensor.)
compare_norm one_lora_cp cp2_lora || fail "LoRA: context parallel differs"
refused cp2_lora_dropout "peft.lora_dropout > 0" "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" \
  "${LORA[@]}" parallel.cp=2

run one_qlora "$NK" finetune "${ARGS[@]}" peft.method=qlora
run dp2_qlora "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=qlora
run zero1_qlora "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=qlora parallel.shard=optimizer
run fsdp_qlora "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=qlora parallel.shard=full
# Resumed: the checkpoint holds each rank's blocks of the adapters, the NF4
# base is train.init_from's again.
run resumed_qlora "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=qlora \
  parallel.shard=full train.exit_at_step=5
run resumed_qlora "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=qlora parallel.shard=full
grep -q "resuming from checkpoint .*step_00000005 at step 5" "$WORK/resumed_qlora.log" ||
  fail "resumed_qlora did not resume at step 5"
grep -q "NF4 (QLoRA)" "$WORK/dp2_qlora.log" || fail "dp2_qlora did not hold an NF4 base"
run cp2_qlora "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=qlora parallel.cp=2
compare one_qlora dp2_qlora zero1_qlora fsdp_qlora resumed_qlora &&
  compare_norm one_qlora cp2_qlora || fail "QLoRA: a parallel run differs"

run one_ia3 "$NK" finetune "${ARGS[@]}" peft.method=ia3
run dp2_ia3 "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=ia3
run fsdp_ia3 "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=ia3 parallel.shard=full
run cp2_ia3 "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=ia3 parallel.cp=2
run one_adapter "$NK" finetune "${ARGS[@]}" peft.method=adapter
run zero1_adapter "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=adapter \
  parallel.shard=optimizer
run cp2_adapter "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=adapter parallel.cp=2
# p-tuning's prompt is laid out after the blocks but trained by the embeddings' backward.
run one_pt "$NK" finetune "${ARGS[@]}" peft.method=p_tuning data.pack=false
run dp2_pt "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=p_tuning data.pack=false
run fsdp_pt "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=p_tuning data.pack=false \
  parallel.shard=full
compare one_ia3 dp2_ia3 fsdp_ia3 && compare one_adapter zero1_adapter &&
  compare_norm one_ia3 cp2_ia3 && compare_norm one_adapter cp2_adapter &&
  compare one_pt dp2_pt fsdp_pt || fail "IA3, bottleneck adapters or p-tuning: a parallel run differs"

# `nekton train` (pretraining data, a random base) with LoRA under FSDP.
TRAIN=(model.preset=gpt-tiny model.n_layer=2 model.d_model=64 model.n_head=4 model.d_ff=128
       "data.path=$REPO/README.md" train.dtype=f32 train.micro_batch=2 train.seq_len=64
       train.global_batch=8 train.steps=10 train.val_every=0 train.threads=1 train.peak_tflops=1
       train.lr=1e-2 parallel.timeout_s=60 "${LORA[@]}")
run one_train "$NK" train "${TRAIN[@]}"
run fsdp_train "$NK" train --nproc 2 "${TRAIN[@]}" parallel.shard=full
compare one_train fsdp_train || fail "nekton train with LoRA: FSDP differs from one process"

pass "LoRA, QLoRA, IA3, bottleneck adapters and p-tuning under DP (2, 4 ranks), ZeRO-1 and FSDP, and all but p-tuning under CP2, equal one process"
