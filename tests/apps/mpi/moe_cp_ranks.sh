#!/usr/bin/env bash
# `nekton train` of Mixture-of-Experts models under context parallelism
# (parallel.cp=2: each row cut into 4 chunks, ring attention) equals one
# process: each cp rank routes its own chunks' tokens, and every layer's
# routing statistics (routed counts, score sums, z-loss sums, per-sequence
# counts) are summed over the cp group in the forward, so the balancing
# loss (per batch, and DeepSeek-V3's per sequence) and the z-loss are the
# whole rows', as one process's. 10 steps in f32, dropless, every step's
# loss and the exported weights within 1e-5 (tests/apps/mpi/compare_runs.py),
# and the logged MoE figures (moe_aux, moe_z, moe_load_max and the tokens
# per expert) within 1e-5:
#   mixtral-tiny      CP2, CP2 x EP2 on 2 ranks (the ep group is the cp
#                     group: each rank's chunks dispatched to the other's
#                     experts), CP2 x EP2 on 4 ranks (dp 2; the experts'
#                     gradients over expert-dp, which spans dp x cp as in
#                     Megatron-Core), CP2 x PP2 under 1F1B and (4 layers)
#                     interleaved (the routing records passed between the
#                     stages are whole rows'), CP2 with full
#                     recompute (the sums taken again, alike), CP2 x TP2 (4
#                     ranks; experts split over tp, and whole: etp 1, the
#                     tp ranks splitting each cp rank's tokens)
#   qwen2-moe-tiny    CP2 (the shared expert and its gate)
#   DeepSeek-style    CP2 and CP2 x EP2: sigmoid scores, group-limited
#                     routing, the sequence-wise balancing loss, a dense
#                     first layer and aux-loss-free balancing (the step's
#                     expert loads, whole rows', move the biases)
#   nekton finetune   mixtral-tiny on packed SFT rows (documents crossing the
#                     chunks) under CP2 and CP2 x EP2, and LoRA on every
#                     expert (all-linear) with trained routers under CP2:
#                     losses, model and adapter (per tensor within 1e-4),
#                     and under EP2 and EP2 x DP2 (4 ranks; within 1e-5),
#                     an EP2 checkpoint resumed on one process;
#                     QLoRA likewise (each expert in NF4 on its own, the
#                     routers dense and trained) under DP2, EP2 and EP2 x
#                     DP2 (within 1e-5; an EP2 checkpoint resumed on one
#                     process) and CP2 (per tensor); LoRA over a bf16 base
#                     under EP2: the exported base bit for bit, the adapter
#                     within bf16's 1e-2 per tensor, resumed on one process
# A checkpoint saved under CP2 x EP2 at step 5 resumes on one process to
# the same 10 steps, and one saved on one process resumes under CP2 x EP2.
# Refused, naming the key: a capacity factor under cp; LoRA on some experts
# only under EP.
#   tests/apps/mpi/moe_cp_ranks.sh REPO BUILD
set -euo pipefail
NAME=moe_cp_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/moe_lib.sh"
compare() {
  /usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" "$@" ||
    fail "$* : a context-parallel MoE run differs from one process"
}
# The weights per tensor (||run - ref|| / ||ref|| <= 1e-4) where the rows'
# 64 tokens make the ring's reordered sums reach elements at 1e-5.
compare_norm() {
  /usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" --tensor-norm "$WORK" "$@" ||
    fail "$* : a context-parallel MoE run differs from one process"
}
# The logged MoE figures of each run against the reference's (rank 0 logs
# its replica's micro-batches' figures: runs without dp only; the tokens
# per expert are every rank's: all runs).
figures() {
  /usr/bin/python3 - "$WORK" "$@" <<'PY' || fail "$* : the MoE figures differ from one process"
import json, sys
work, ref, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
rec = lambda r: [json.loads(l) for l in open(f"{work}/{r.lstrip('+')}/metrics.jsonl")]
want = rec(ref)
for run in runs:
    got = rec(run)
    assert len(got) == len(want), (run, len(got), len(want))
    for a, b in zip(got, want):
        keys = [k for k in b if k.startswith("moe_tokens.")]
        if not run.startswith("+"):  # "+run": data parallel, the tokens only
            keys += [k for k in b if k in ("moe_aux", "moe_z", "moe_load_max")]
        assert keys, (ref, "logged no MoE figures", sorted(b))
        for k in keys:
            x, y = a.get(k), b[k]
            assert x is not None, (run, a["step"], k, "not logged")
            xs, ys = (x, y) if isinstance(y, list) else ([x], [y])
            for u, v in zip(xs, ys):
                assert abs(u - v) <= 1e-5 * max(1, abs(v)), (run, a["step"], k, x, y)
PY
}
CP=(parallel.cp=2)
# The tokens per expert are logged at log steps: every step.
MIX+=(train.log_every=1)
QWEN+=(train.log_every=1)

run one "$NK" train "${MIX[@]}"
run cp2 "${MPI[@]}" 2 "$NK" train "${MIX[@]}" "${CP[@]}"
grep -q "context parallel: world 2 = tp 1 × cp 2" "$WORK/cp2.log" ||
  fail "cp2 did not run context parallel: $(grep -m1 parallel "$WORK/cp2.log")"
run cp2ep2 "${MPI[@]}" 2 "$NK" train "${MIX[@]}" "${CP[@]}" parallel.ep=2
grep -q "world 2 = tp 1 × cp 2 × dp 1 .* experts etp 1 × ep 2 × edp 1" "$WORK/cp2ep2.log" ||
  fail "cp2ep2 did not run CP2 x EP2: $(grep -m1 parallel "$WORK/cp2ep2.log")"
run cp2ep2dp2 "${MPI[@]}" 4 "$NK" train "${MIX[@]}" "${CP[@]}" parallel.ep=2
grep -q "world 4 = tp 1 × cp 2 × dp 2 .* experts etp 1 × ep 2 × edp 2" "$WORK/cp2ep2dp2.log" ||
  fail "cp2ep2dp2 did not run CP2 x EP2 x DP2: $(grep -m1 parallel "$WORK/cp2ep2dp2.log")"
run cp2pp2 "${MPI[@]}" 4 "$NK" train "${MIX[@]}" "${CP[@]}" parallel.pp=2
grep -q "pipeline stage 0 of 2" "$WORK/cp2pp2.log" || fail "cp2pp2 did not run a pipeline"
run cp2full "${MPI[@]}" 2 "$NK" train "${MIX[@]}" "${CP[@]}" train.recompute=full
run cp2tp2 "${MPI[@]}" 4 "$NK" train "${MIX[@]}" "${CP[@]}" parallel.tp=2
run cp2tp2etp1 "${MPI[@]}" 4 "$NK" train "${MIX[@]}" "${CP[@]}" parallel.tp=2 parallel.etp=1
grep -q "world 4 = tp 2 × cp 2 × dp 1 .* experts etp 1 × ep 1 × edp 4" "$WORK/cp2tp2etp1.log" ||
  fail "cp2tp2etp1 did not run CP2 x TP2 ETP1: $(grep -m1 parallel "$WORK/cp2tp2etp1.log")"
# Saved under CP2 x EP2 at step 5, resumed on one process; saved on one
# process, resumed under CP2 x EP2.
run cp2ep2to1 "${MPI[@]}" 2 "$NK" train "${MIX[@]}" "${CP[@]}" parallel.ep=2 train.exit_at_step=5
run cp2ep2to1 "$NK" train "${MIX[@]}"
grep -q "resuming from checkpoint" "$WORK/cp2ep2to1.log" || fail "cp2ep2to1 did not resume"
run onetocp2ep2 "$NK" train "${MIX[@]}" train.exit_at_step=5
run onetocp2ep2 "${MPI[@]}" 2 "$NK" train "${MIX[@]}" "${CP[@]}" parallel.ep=2
grep -q "resuming from checkpoint" "$WORK/onetocp2ep2.log" || fail "onetocp2ep2 did not resume"
compare one cp2 cp2ep2 cp2ep2dp2 cp2pp2 cp2full cp2tp2 cp2tp2etp1 cp2ep2to1 onetocp2ep2
figures one cp2 cp2ep2 +cp2ep2dp2 cp2pp2 cp2full cp2tp2 cp2tp2etp1

# The interleaved schedule: 4 layers in 4 chunks, each rank two.
run one4 "$NK" train "${MIX[@]}" model.n_layer=4
run cp2pp2vp2 "${MPI[@]}" 4 "$NK" train "${MIX[@]}" "${CP[@]}" model.n_layer=4 parallel.pp=2 \
  parallel.vp=2
grep -q "interleaved 1F1B" "$WORK/cp2pp2vp2.log" ||
  fail "cp2pp2vp2 did not run the interleaved schedule: $(grep -m1 parallel "$WORK/cp2pp2vp2.log")"
compare one4 cp2pp2vp2
figures one4 cp2pp2vp2

# Qwen2-MoE: the shared expert and its gate on each rank's chunks.
run qone "$NK" train "${QWEN[@]}"
run qcp2 "${MPI[@]}" 2 "$NK" train "${QWEN[@]}" "${CP[@]}"
compare qone qcp2
figures qone qcp2

# DeepSeek-style routing with the sequence-wise balancing loss (each
# sequence's counts and scores summed over its chunks) and aux-loss-free
# balancing.
DS=(model.moe_score_func=sigmoid model.num_experts=8 model.moe_n_group=4 model.moe_topk_group=2
    model.moe_routed_scaling=2.5 model.moe_aux_loss_type=seq model.moe_aux_loss_coeff=0.01
    model.moe_first_dense_layers=1 model.n_layer=3 model.moe_bias_update_rate=0.01)
run ds_one "$NK" train "${MIX[@]}" "${DS[@]}"
run ds_cp2 "${MPI[@]}" 2 "$NK" train "${MIX[@]}" "${DS[@]}" "${CP[@]}"
run ds_cp2ep2 "${MPI[@]}" 2 "$NK" train "${MIX[@]}" "${DS[@]}" "${CP[@]}" parallel.ep=2
compare ds_one ds_cp2 ds_cp2ep2
figures ds_one ds_cp2 ds_cp2ep2

# Fine-tuning: packed rows whose documents cross the chunks; LoRA on the
# experts (each expert's adapters over the rows it received) with the
# routers trained.
/usr/bin/python3 - "$WORK/sft.jsonl" <<'PY'
import json, random, sys
r = random.Random(5)
with open(sys.argv[1], "w") as f:
    for i in range(64):
        w = "".join(r.choice("abcdefghij") for _ in range(r.randint(1, 12)))
        f.write(json.dumps({"input": "repeat " + w + ":", "output": " " + w * r.randint(1, 3)}) + "\n")
PY
SFT=(model.preset=mixtral-tiny model.vocab_size=264 "data.sft_path=$WORK/sft.jsonl"
     data.chat_template=plain data.pack=true train.seq_len=64 train.lr=3e-3
     "data.sft_valid_path=$WORK/sft.jsonl" train.val_batches=4 train.dtype=f32 train.micro_batch=2
     train.global_batch=8 train.steps=6 train.warmup_steps=0 train.val_every=3 train.peak_tflops=1
     train.threads=1 parallel.timeout_s=60)
LORA=(peft.method=lora peft.target_modules=all-linear peft.train_router=true)
run sft1 "$NK" finetune "${SFT[@]}"
run sftcp2 "${MPI[@]}" 2 "$NK" finetune "${SFT[@]}" "${CP[@]}"
run sftcp2ep2 "${MPI[@]}" 2 "$NK" finetune "${SFT[@]}" "${CP[@]}" parallel.ep=2
compare_norm sft1 sftcp2 sftcp2ep2
run lora1 "$NK" finetune "${SFT[@]}" "${LORA[@]}"
run loracp2 "${MPI[@]}" 2 "$NK" finetune "${SFT[@]}" "${LORA[@]}" "${CP[@]}"
grep -q "LoRA r=8 alpha=16 on 32 modules" "$WORK/loracp2.log" ||
  fail "loracp2 did not adapt the experts: $(grep -m1 peft "$WORK/loracp2.log")"
compare_norm lora1 loracp2
# Expert parallelism: each rank holds its experts' adapters (rows of the
# layers' stacked A and B, split as the experts are) and exports the whole
# adapter gathered; an EP2 checkpoint resumes on one process.
run loraep2 "${MPI[@]}" 2 "$NK" finetune "${SFT[@]}" "${LORA[@]}" parallel.ep=2
run loraep2dp2 "${MPI[@]}" 4 "$NK" finetune "${SFT[@]}" "${LORA[@]}" parallel.ep=2
grep -q "each rank holds and computes 2 of the 4 experts" "$WORK/loraep2dp2.log" ||
  fail "loraep2dp2 did not split the experts: $(grep -m1 parallel "$WORK/loraep2dp2.log")"
run loraep2to1 "${MPI[@]}" 2 "$NK" finetune "${SFT[@]}" "${LORA[@]}" parallel.ep=2 \
  train.exit_at_step=3
run loraep2to1 "$NK" finetune "${SFT[@]}" "${LORA[@]}"
grep -q "resuming from checkpoint" "$WORK/loraep2to1.log" || fail "loraep2to1 did not resume"
compare lora1 loraep2 loraep2dp2 loraep2to1
refuse oneexpert "adapts 1 of the 4 experts of a layer" \
  "${MPI[@]}" 2 "$NK" finetune "${SFT[@]}" peft.method=lora peft.target_modules=experts.1.w1 \
  parallel.ep=2
QLORA=(peft.method=qlora peft.target_modules=all-linear peft.train_router=true)
run qlora1 "$NK" finetune "${SFT[@]}" "${QLORA[@]}"
run qloradp2 "${MPI[@]}" 2 "$NK" finetune "${SFT[@]}" "${QLORA[@]}"
run qloracp2 "${MPI[@]}" 2 "$NK" finetune "${SFT[@]}" "${QLORA[@]}" "${CP[@]}"
grep -q "NF4 (QLoRA)" "$WORK/qloradp2.log" || fail "qloradp2 did not hold an NF4 base"
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" qlora1 qloradp2 ||
  fail "QLoRA on the MoE model: DP2 differs from one process"
compare_norm qlora1 qloracp2
# QLoRA under EP: each rank holds its experts' NF4 runs and their adapters; an EP2 checkpoint (the adapters alone) resumes
# on one process over the base read again.
run qloraep2 "${MPI[@]}" 2 "$NK" finetune "${SFT[@]}" "${QLORA[@]}" parallel.ep=2
run qloraep2dp2 "${MPI[@]}" 4 "$NK" finetune "${SFT[@]}" "${QLORA[@]}" parallel.ep=2
run qloraep2to1 "${MPI[@]}" 2 "$NK" finetune "${SFT[@]}" "${QLORA[@]}" parallel.ep=2 \
  train.exit_at_step=3
run qloraep2to1 "$NK" finetune "${SFT[@]}" "${QLORA[@]}"
grep -q "resuming from checkpoint" "$WORK/qloraep2to1.log" || fail "qloraep2to1 did not resume"
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" qlora1 qloraep2 qloraep2dp2 \
  qloraep2to1 || fail "QLoRA on the MoE model: EP2 differs from one process"
# LoRA over a bf16 base under EP2: the export holds the base (gathered
# through f32, bit for bit) and the checkpoint the adapters alone, which
# resume on one process.
BFLORA=("${SFT[@]}" "${LORA[@]}" train.dtype=bf16)
run lorabf1 "$NK" finetune "${BFLORA[@]}"
run lorabfep2 "${MPI[@]}" 2 "$NK" finetune "${BFLORA[@]}" parallel.ep=2
run lorabfep2to1 "${MPI[@]}" 2 "$NK" finetune "${BFLORA[@]}" parallel.ep=2 train.exit_at_step=3
run lorabfep2to1 "$NK" finetune "${BFLORA[@]}"
grep -q "resuming from checkpoint" "$WORK/lorabfep2to1.log" || fail "lorabfep2to1 did not resume"
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" --bf16-base "$WORK" lorabf1 lorabfep2 \
  lorabfep2to1 || fail "LoRA over a bf16 base: EP2 differs from one process"

refuse cap "parallel.cp = 2: model.moe_capacity_factor" \
  "${MPI[@]}" 2 "$NK" train "${MIX[@]}" "${CP[@]}" model.moe_capacity_factor=1.0
pass "MoE training under CP2 (alone, with EP2 on the cp ranks, EP2xDP2, PP2, full recompute, TP2 with experts split and whole) equals one process (and CP2xPP2 VP2) for mixtral-tiny, qwen2-moe-tiny (shared expert) and a DeepSeek-style model (sequence-wise balancing loss, aux-loss-free biases): losses, weights and MoE figures; fine-tuning on packed rows under CP2 and CP2xEP2, LoRA on the experts under CP2, EP2 and EP2xDP2 too (an EP2 checkpoint resumed on one process), QLoRA under DP2, CP2, EP2 and EP2xDP2 (an EP2 checkpoint resumed on one process), LoRA over a bf16 base under EP2 (its export's base bit for bit, resumed on one process); a CP2xEP2 checkpoint resumes on one process and a one-process one under CP2xEP2; a capacity factor under cp refused by key"
