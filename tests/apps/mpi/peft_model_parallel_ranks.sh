#!/usr/bin/env bash
# PEFT adapters under tensor and pipeline parallelism equal one process:
# from a saved base (train.init_from), 10 steps of packed SFT rows. Each
# adapter is split as its layer is (model/peft.cc): LoRA's A whole and B by
# rows over a column-parallel layer (q|k|v, gate|up), A by columns and B
# whole over a row-parallel one (o, down), the whole factor's gradient added
# over the tp group.
#  - f32 LoRA (all-linear) under TP2, TP2 with SP, TP2 x DP2, PP2 and
#    TP2 x PP2: every loss within 1e-5, the exported model and the PEFT
#    adapter per tensor within 1e-4 (Adam turns the ranks' other order of
#    sums into single elements of 1e-5: measured 8.2e-6 per element); PP2
#    bit for bit. Stopped at step 5 under TP2 and resumed under TP2, and on
#    one process (the checkpoint holds whole tensors).
#  - LoRA dropout on q_proj and v_proj (column-parallel: every rank draws
#    one process's mask over the whole input) under TP2.
#  - LoRA over a bf16 base (train.dtype=bf16: the base held in bf16 alone)
#    under TP2 and PP2, TP2 resumed: the base exported bit for bit, the
#    losses within 1e-3 under TP (each rank's partial product of a
#    row-parallel layer is rounded to bf16 before the sum; measured
#    1.05e-4), the adapters per tensor within 1.5e-1 under TP (Adam
#    amplifies that rounding where a gradient nearly cancels: measured
#    7.1e-2, while the one-process bf16 run's own distance from the f32 run
#    is 9.3e-2), PP2 bit for bit.
#  - QLoRA, bottleneck adapters and IA3 under PP2 (bit for bit), IA3 (output
#    scales of k, v and o, the input scale of down) under TP2.
#  - GPT-2 from scratch (`nekton train`): LoRA on every linear layer (the
#    fused c_attn's B split by rows of each of q, k, v) and IA3 under TP2.
# A row-parallel layer's LoRA dropout is drawn by each rank over its own
# input columns (not one process's mask: not compared here).
#  - LoRA on every linear layer of mixtral-tiny and qwen2-moe-tiny (each
#    expert's A and B split as its weight; the shared expert's as an MLP's)
#    under TP2 with the experts split (etp = tp) and whole (etp = 1), and
#    mixtral-tiny under TP2 x EP2.
#  - bottleneck adapters (on linear_proj and linear_fc2, after the group's
#    sum) under TP2, TP2+SP and TP2 x PP2.
#  - p-tuning (a prompt from an MLP encoder) under PP2 (bit for bit), TP2,
#    TP2 with SP (also with the virtual tokens over both ranks), CP2 (also
#    over both), CP2 x TP2 with SP, TP2 x PP2 and
#    PP2 x DP2 FSDP, stopped under TP2 and resumed on one
#    process.
#  - QLoRA (all-linear, a base 128 wide) under TP2, TP2 with SP, TP2 x DP2
#    with ZeRO-1 and with FSDP, TP2 x PP2, stopped at step 5 and resumed under TP2 and on
#    one process: each rank's NF4 share cut from the whole tensor's blocks,
#    so its values are one process's (losses within 1e-5, the adapter per
#    tensor within 1e-4); in bf16 under TP2 (losses within 1e-3, the
#    adapter within 0.15 per tensor, as LoRA over a bf16 base); on
#    mixtral-tiny 128 wide with the experts split (etp = tp), whole
#    (etp = 1), and TP2 x EP2.
# Refused, naming the key or tensor: QLoRA shares that are not whole NF4
# blocks, bottleneck adapters on column-parallel layers under TP, adapters
# on a MoE model with 1 < etp < tp.
#   tests/apps/mpi/peft_model_parallel_ranks.sh REPO BUILD
set -euo pipefail
NAME=peft_model_parallel_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/ranks_lib.sh"

run base "$NK" finetune "${SFT_ARGS[@]}" train.steps=3
ARGS=("${SFT_ARGS[@]}" train.init_from="$WORK/base/model" train.lr=1e-2)
LORA=(peft.method=lora peft.target_modules=all-linear)

run one "$NK" finetune "${ARGS[@]}" "${LORA[@]}"
run tp2 "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" "${LORA[@]}" parallel.tp=2
run tp2sp "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" "${LORA[@]}" parallel.tp=2 parallel.sp=true
run tp2dp2 "${MPI[@]}" 4 "$NK" finetune "${ARGS[@]}" "${LORA[@]}" parallel.tp=2
run pp2 "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" "${LORA[@]}" parallel.pp=2
run tp2pp2 "${MPI[@]}" 4 "$NK" finetune "${ARGS[@]}" "${LORA[@]}" parallel.tp=2 parallel.pp=2
run tp2resumed "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" "${LORA[@]}" parallel.tp=2 \
  train.exit_at_step=5
run tp2resumed "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" "${LORA[@]}" parallel.tp=2
run tp2to1 "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" "${LORA[@]}" parallel.tp=2 train.exit_at_step=5
run tp2to1 "$NK" finetune "${ARGS[@]}" "${LORA[@]}"
grep -q "tp 2" "$WORK/tp2.log" || fail "tp2 did not run tensor parallel"
grep -q "pp 2" "$WORK/pp2.log" || fail "pp2 did not run pipeline parallel"
grep -q "peft: LoRA" "$WORK/tp2.log" || fail "tp2 did not train LoRA"
for r in tp2resumed tp2to1; do
  grep -q "resuming from checkpoint .*step_00000005 at step 5" "$WORK/$r.log" ||
    fail "$r did not resume at step 5"
done
compare one pp2 || fail "LoRA: PP2 differs from one process"
compare_norm one tp2 tp2sp tp2dp2 tp2pp2 tp2resumed tp2to1 ||
  fail "LoRA: tensor parallel differs from one process"

DROP=(peft.method=lora peft.target_modules=q_proj,v_proj peft.lora_dropout=0.1)
run one_drop "$NK" finetune "${ARGS[@]}" "${DROP[@]}"
run tp2_drop "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" "${DROP[@]}" parallel.tp=2
compare_norm one_drop tp2_drop || fail "LoRA dropout on column-parallel layers: TP2 differs"

BF=("${ARGS[@]}" "${LORA[@]}" train.dtype=bf16)
run one_bf "$NK" finetune "${BF[@]}"
run tp2_bf "${MPI[@]}" 2 "$NK" finetune "${BF[@]}" parallel.tp=2
run pp2_bf "${MPI[@]}" 2 "$NK" finetune "${BF[@]}" parallel.pp=2
run tp2resumed_bf "${MPI[@]}" 2 "$NK" finetune "${BF[@]}" parallel.tp=2 train.exit_at_step=5
run tp2resumed_bf "${MPI[@]}" 2 "$NK" finetune "${BF[@]}" parallel.tp=2
grep -q "resuming from checkpoint .*step_00000005 at step 5" "$WORK/tp2resumed_bf.log" ||
  fail "tp2resumed_bf did not resume at step 5"
grep -q "frozen base held as bf16" "$WORK/tp2_bf.log" || fail "tp2_bf did not hold a bf16 base"
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" --bf16-base "$WORK" one_bf pp2_bf &&
  /usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" --loss-tol 1e-3 --trained-tol 0.15 \
    --bf16-base "$WORK" one_bf tp2_bf tp2resumed_bf ||
  fail "LoRA over a bf16 base: a model-parallel run differs from one process"

run one_qlora "$NK" finetune "${ARGS[@]}" peft.method=qlora
run pp2_qlora "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=qlora parallel.pp=2
run one_adapter "$NK" finetune "${ARGS[@]}" peft.method=adapter
run pp2_adapter "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=adapter parallel.pp=2
IA3=(peft.method=ia3 peft.target_modules=k_proj,v_proj,o_proj,down_proj
     peft.feedforward_modules=down_proj)
run one_ia3 "$NK" finetune "${ARGS[@]}" "${IA3[@]}"
run tp2_ia3 "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" "${IA3[@]}" parallel.tp=2
run pp2_ia3 "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" "${IA3[@]}" parallel.pp=2
compare one_qlora pp2_qlora && compare one_adapter pp2_adapter && compare one_ia3 pp2_ia3 &&
  compare_norm one_ia3 tp2_ia3 ||
  fail "QLoRA, bottleneck adapters or IA3: a model-parallel run differs from one process"

# GPT-2 (`nekton train`, a random base): LoRA on the fused c_attn (B split
# by rows of each of q, k and v, as the weight is), c_fc and both c_proj;
# IA3 scaling c_fc's input (a whole input over a column-parallel layer: its
# gradient summed over the group) and both c_proj's outputs (over the
# partial sums, the bias on rank 0 alone).
TRAIN=(model.preset=gpt-tiny model.n_layer=2 model.d_model=64 model.n_head=4 model.d_ff=128
       "data.path=$REPO/README.md" train.dtype=f32 train.micro_batch=2 train.seq_len=64
       train.global_batch=8 train.steps=10 train.val_every=0 train.threads=1 train.peak_tflops=1
       train.lr=1e-2 parallel.timeout_s=60)
GPT_IA3=(peft.method=ia3 peft.target_modules=c_attn,c_fc,c_proj peft.feedforward_modules=c_fc)
run one_gpt "$NK" train "${TRAIN[@]}" "${LORA[@]}"
run tp2_gpt "${MPI[@]}" 2 "$NK" train "${TRAIN[@]}" "${LORA[@]}" parallel.tp=2
run one_gpt_ia3 "$NK" train "${TRAIN[@]}" "${GPT_IA3[@]}"
run tp2_gpt_ia3 "${MPI[@]}" 2 "$NK" train "${TRAIN[@]}" "${GPT_IA3[@]}" parallel.tp=2
compare_norm one_gpt tp2_gpt && compare_norm one_gpt_ia3 tp2_gpt_ia3 ||
  fail "GPT-2 LoRA or IA3: TP2 differs from one process"

# Mixture of Experts (6 SFT steps from a random base, the routers trained
# whole): each expert's A and B split as its weight (gate | up by rows, down
# by columns), over the tp group (etp = tp), or whole with the block's rows
# split (etp = 1), with EP2 (4 ranks); Qwen2-MoE's shared expert as an MLP.
MOE=("${SFT_ARGS[@]}" model.preset=mixtral-tiny train.steps=6 train.val_every=3
     peft.method=lora peft.target_modules=all-linear peft.train_router=true)
QWEN=("${MOE[@]}" model.preset=qwen2-moe-tiny train.eps=1e-6)
run one_moe "$NK" finetune "${MOE[@]}"
run tp2_moe "${MPI[@]}" 2 "$NK" finetune "${MOE[@]}" parallel.tp=2
run tp2etp1_moe "${MPI[@]}" 2 "$NK" finetune "${MOE[@]}" parallel.tp=2 parallel.etp=1
run tp2ep2_moe "${MPI[@]}" 4 "$NK" finetune "${MOE[@]}" parallel.tp=2 parallel.ep=2
run one_qwen "$NK" finetune "${QWEN[@]}"
run tp2_qwen "${MPI[@]}" 2 "$NK" finetune "${QWEN[@]}" parallel.tp=2
run tp2etp1_qwen "${MPI[@]}" 2 "$NK" finetune "${QWEN[@]}" parallel.tp=2 parallel.etp=1
grep -q "LoRA r=8 alpha=16 on 32 modules" "$WORK/tp2_moe.log" ||
  fail "tp2_moe did not adapt the experts: $(grep -m1 peft "$WORK/tp2_moe.log")"
compare_norm one_moe tp2_moe tp2etp1_moe tp2ep2_moe && compare_norm one_qwen tp2_qwen tp2etp1_qwen ||
  fail "LoRA on a MoE model: tensor parallel differs from one process"
# QLoRA on a MoE model: each expert quantised on its own (bitsandbytes'
# per-expert nn.Linear), its share cut from its own blocks.
MOE_WIDE=("${SFT_ARGS[@]}" model.preset=mixtral-tiny model.d_model=128 model.d_ff=128
          model.moe_d_ff=128 train.steps=6 train.val_every=3)
run base_moe_wide "$NK" finetune "${MOE_WIDE[@]}" train.steps=3
QMOE=("${MOE_WIDE[@]}" train.init_from="$WORK/base_moe_wide/model" peft.method=qlora
      peft.target_modules=all-linear peft.train_router=true)
run one_qmoe "$NK" finetune "${QMOE[@]}"
run tp2_qmoe "${MPI[@]}" 2 "$NK" finetune "${QMOE[@]}" parallel.tp=2
run tp2etp1_qmoe "${MPI[@]}" 2 "$NK" finetune "${QMOE[@]}" parallel.tp=2 parallel.etp=1
run tp2ep2_qmoe "${MPI[@]}" 4 "$NK" finetune "${QMOE[@]}" parallel.tp=2 parallel.ep=2
compare_norm one_qmoe tp2_qmoe tp2etp1_qmoe tp2ep2_qmoe ||
  fail "QLoRA on a MoE model: tensor parallel differs from one process"

# QLoRA under TP: each rank's share of every NF4 weight is cut from the
# whole tensor's blocks (quantised as one process quantises it), so a rank
# holds one process's values and TP equals one process as LoRA does. A base
# 128 wide: a row-parallel weight's 64 columns per rank are whole blocks.
WIDE=(model.d_model=128 model.d_ff=256)
run base_wide "$NK" finetune "${SFT_ARGS[@]}" "${WIDE[@]}" train.steps=3
QLORA=("${SFT_ARGS[@]}" "${WIDE[@]}" train.init_from="$WORK/base_wide/model" train.lr=1e-2
       peft.method=qlora peft.target_modules=all-linear)
run one_qtp "$NK" finetune "${QLORA[@]}"
run tp2_qlora "${MPI[@]}" 2 "$NK" finetune "${QLORA[@]}" parallel.tp=2
run tp2sp_qlora "${MPI[@]}" 2 "$NK" finetune "${QLORA[@]}" parallel.tp=2 parallel.sp=true
run tp2dp2_qlora "${MPI[@]}" 4 "$NK" finetune "${QLORA[@]}" parallel.tp=2 \
  parallel.shard=optimizer
run tp2pp2_qlora "${MPI[@]}" 4 "$NK" finetune "${QLORA[@]}" parallel.tp=2 parallel.pp=2
run tp2fsdp_qlora "${MPI[@]}" 4 "$NK" finetune "${QLORA[@]}" parallel.tp=2 parallel.shard=full
run tp2resumed_qlora "${MPI[@]}" 2 "$NK" finetune "${QLORA[@]}" parallel.tp=2 \
  train.exit_at_step=5
run tp2resumed_qlora "${MPI[@]}" 2 "$NK" finetune "${QLORA[@]}" parallel.tp=2
run tp2to1_qlora "${MPI[@]}" 2 "$NK" finetune "${QLORA[@]}" parallel.tp=2 train.exit_at_step=5
run tp2to1_qlora "$NK" finetune "${QLORA[@]}"
grep -q "NF4 (QLoRA)" "$WORK/tp2_qlora.log" || fail "tp2_qlora did not hold an NF4 base"
for r in tp2resumed_qlora tp2to1_qlora; do
  grep -q "resuming from checkpoint .*step_00000005 at step 5" "$WORK/$r.log" ||
    fail "$r did not resume at step 5"
done
compare_norm one_qtp tp2_qlora tp2sp_qlora tp2dp2_qlora tp2pp2_qlora tp2fsdp_qlora \
  tp2resumed_qlora tp2to1_qlora || fail "QLoRA: tensor parallel differs from one process"
# In bf16 (the NF4 values read back in bf16): as LoRA over a bf16 base,
# each rank's partial products are rounded before the group's sum (at lr
# 3e-3: at 1e-2 this recipe's step 3 jumps to a gradient norm of 11 on one
# process, and the rounding's 2e-5 at step 2 grows to 3e-3 through it).
run one_qtp_bf "$NK" finetune "${QLORA[@]}" train.dtype=bf16 train.lr=3e-3
run tp2_qlora_bf "${MPI[@]}" 2 "$NK" finetune "${QLORA[@]}" train.dtype=bf16 train.lr=3e-3 \
  parallel.tp=2
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" --loss-tol 1e-3 --trained-tol 0.15 \
  --bf16-base "$WORK" one_qtp_bf tp2_qlora_bf || fail "QLoRA in bf16: TP2 differs from one process"
# A share that is not whole blocks (64 wide: 32 columns of o_proj per rank)
# is refused naming the tensor, before mpirun starts (--nproc) or on every
# rank.
refused qlora_tp_narrow \
  "peft.method=qlora under parallel.tp = 2: 'h.0.attn.proj.weight' [64, 64]: rank" \
  "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=qlora parallel.tp=2
refused qlora_tp_narrow_nproc "'h.0.attn.proj.weight' [64, 64]: rank 0 holds 32" \
  "$NK" finetune "${ARGS[@]}" peft.method=qlora parallel.tp=2 --nproc 2
# Bottleneck adapters after the row-parallel layers (linear_proj,
# linear_fc2: NeMo's defaults) run after the group's sum, whole on every tp
# rank (under SP on the rank's rows, their gradients summed over the group).
run one_bn "$NK" finetune "${ARGS[@]}" peft.method=adapter
run tp2_bn "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=adapter parallel.tp=2
run tp2sp_bn "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=adapter parallel.tp=2 \
  parallel.sp=true
run tp2pp2_bn "${MPI[@]}" 4 "$NK" finetune "${ARGS[@]}" peft.method=adapter parallel.tp=2 \
  parallel.pp=2
compare_norm one_bn tp2_bn tp2sp_bn tp2pp2_bn ||
  fail "bottleneck adapters: TP2, TP2+SP or TP2 x PP2 differs from one process"
refused adapter_tp "peft.target_modules: a bottleneck adapter on 'model.layers.0.self_attn.linear_qkv'" \
  "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" peft.method=adapter peft.target_modules=all-linear \
  parallel.tp=2
# P-tuning: the prompt (table and MLP encoder) on the embedding's stage,
# whole on every tp rank after the vocabulary-parallel embedding's sum;
# under FSDP with a pipeline the first stage gathers the encoder again for
# the embeddings' backward. Under sequence parallelism each rank places the
# virtual positions among its rows (with one row of 32 a micro-batch, the
# 20 virtual tokens on both ranks: 16 and 4), the prompt's gradient summed
# over the group; under context parallelism among its two chunks of each
# row (chunks of 8 of a row of 32, rank 0 holding chunks 0 and 3: the
# virtual tokens 0-7 on rank 0, 8-19 in both of rank 1's), its gradient
# reduced with the rest over dp x cp.
PT=("${ARGS[@]}" peft.method=p_tuning data.pack=false)
run one_pt "$NK" finetune "${PT[@]}"
run pp2_pt "${MPI[@]}" 2 "$NK" finetune "${PT[@]}" parallel.pp=2
run tp2_pt "${MPI[@]}" 2 "$NK" finetune "${PT[@]}" parallel.tp=2
run tp2pp2_pt "${MPI[@]}" 4 "$NK" finetune "${PT[@]}" parallel.tp=2 parallel.pp=2
run tp2sp_pt "${MPI[@]}" 2 "$NK" finetune "${PT[@]}" parallel.tp=2 parallel.sp=true
run tp2sp_pt_bs1 "${MPI[@]}" 2 "$NK" finetune "${PT[@]}" parallel.tp=2 parallel.sp=true \
  train.micro_batch=1 train.seq_len=32
run one_pt_bs1 "$NK" finetune "${PT[@]}" train.micro_batch=1 train.seq_len=32
run cp2_pt "${MPI[@]}" 2 "$NK" finetune "${PT[@]}" parallel.cp=2
run cp2_pt_bs1 "${MPI[@]}" 2 "$NK" finetune "${PT[@]}" parallel.cp=2 train.micro_batch=1 \
  train.seq_len=32
run cp2tp2sp_pt "${MPI[@]}" 4 "$NK" finetune "${PT[@]}" parallel.cp=2 parallel.tp=2 \
  parallel.sp=true
run pp2fsdp_pt "${MPI[@]}" 4 "$NK" finetune "${PT[@]}" parallel.pp=2 parallel.shard=full
run tp2to1_pt "${MPI[@]}" 2 "$NK" finetune "${PT[@]}" parallel.tp=2 train.exit_at_step=5
run tp2to1_pt "$NK" finetune "${PT[@]}"
grep -q "peft: p-tuning" "$WORK/tp2pp2_pt.log" || fail "tp2pp2_pt did not train a p-tuning prompt"
compare one_pt pp2_pt || fail "p-tuning: PP2 differs from one process"
compare_norm one_pt tp2_pt tp2pp2_pt pp2fsdp_pt tp2to1_pt tp2sp_pt cp2_pt cp2tp2sp_pt &&
  compare_norm one_pt_bs1 tp2sp_pt_bs1 cp2_pt_bs1 ||
  fail "p-tuning: TP2, TP2+SP, CP2, CP2 x TP2+SP, TP2 x PP2 or PP2 x DP2 FSDP differs from one process"
refused moe_etp "parallel.tp = 4, parallel.etp = 2: adapters on a Mixture-of-Experts model" \
  "${MPI[@]}" 4 "$NK" finetune "${MOE[@]}" parallel.tp=4 parallel.etp=2 model.n_kv_head=4
pass "LoRA under TP2, TP2+SP, TP2 x DP2, PP2 and TP2 x PP2 (resumed under TP2 and on one process), LoRA dropout under TP2, LoRA over a bf16 base under TP2 and PP2, QLoRA and bottleneck adapters under PP2, QLoRA under TP2, TP2+SP, TP2 x DP2 (ZeRO-1, FSDP), TP2 x PP2 and in bf16 (resumed under TP2 and on one process; MoE under TP2, etp 1 and TP2 x EP2), IA3 under TP2, GPT-2 LoRA and IA3 under TP2, MoE LoRA under TP2 (etp 2 and 1) and TP2 x EP2, bottleneck adapters under TP2, TP2+SP and TP2 x PP2, p-tuning under PP2, TP2, TP2+SP, CP2, CP2 x TP2+SP, TP2 x PP2 and PP2 x DP2 FSDP equal one process"
