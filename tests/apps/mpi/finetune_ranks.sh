#!/usr/bin/env bash
# `nekton finetune` over several processes equals one process (issue 37,
# item 8): packed SFT rows with varying numbers of trained tokens per
# micro-batch, 10 steps, under plain data parallelism (2 and 4 ranks), ZeRO-1,
# FSDP, tensor parallelism (with and without sequence parallelism), FSDP
# from train.init_from and unpacked rows: every step's loss and the exported weights within 1e-5 (f32;
# the ranks add the same gradients in another order). Pipeline parallelism
# is refused, naming parallel.pp.
#   tests/apps/mpi/finetune_ranks.sh REPO BUILD
set -euo pipefail
NAME=finetune_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/script_lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1

# Prompt/answer records of many lengths: each micro-batch trains a different
# number of tokens. The validation reads 24 of the 32 packed rows: the first
# ones (first-fit-decreasing) hold one long sample each, the later several.
/usr/bin/python3 - "$WORK/sft.jsonl" <<'PY'
import json, random, sys
r = random.Random(5)
with open(sys.argv[1], "w") as f:
    for i in range(64):
        w = "".join(r.choice("abcdefghij") for _ in range(r.randint(1, 12)))
        f.write(json.dumps({"input": "repeat " + w + ":", "output": " " + w * r.randint(1, 3)}) + "\n")
PY
ARGS=(model.preset=llama-tiny model.n_layer=2 model.d_model=64 model.n_head=4 model.n_kv_head=2
      model.d_ff=128 model.vocab_size=264 data.sft_path=$WORK/sft.jsonl data.chat_template=plain
      data.pack=true train.dtype=f32 train.micro_batch=2 train.seq_len=64 train.global_batch=8
      train.steps=10 train.lr=3e-3 train.warmup_steps=0 train.peak_tflops=1
      data.sft_valid_path=$WORK/sft.jsonl train.val_every=5 train.val_batches=12
      train.threads=1 parallel.bucket_mb=0.05 parallel.timeout_s=60)
run() {
  local out=$1
  shift
  timeout $((120 * ${NK_TIME_SCALE:-1})) "$@" train.out_dir="$WORK/$out" >"$WORK/$out.log" 2>&1 ||
    fail "$out: $*"
}
MPI=(mpirun --oversubscribe -np)
run one "$NK" finetune "${ARGS[@]}"
run dp2 "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}"
run dp4 "${MPI[@]}" 4 "$NK" finetune "${ARGS[@]}"
run nproc2 "$NK" finetune --nproc 2 "${ARGS[@]}"
run zero1 "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" parallel.shard=optimizer
run fsdp "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" parallel.shard=full
run tp2 "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" parallel.tp=2
run tp2sp "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" parallel.tp=2 parallel.sp=true
grep -q "data parallel: world 2" "$WORK/dp2.log" || fail "dp2 did not run data parallel"
grep -q "tp 2" "$WORK/tp2.log" || fail "tp2 did not run tensor parallel"
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" one dp2 dp4 nproc2 zero1 fsdp tp2 tp2sp ||
  fail "a parallel run differs from one process"
# From a saved model (train.init_from, the usual fine-tuning), under FSDP.
run one_init "$NK" finetune "${ARGS[@]}" train.init_from="$WORK/one/model" train.steps=5
run fsdp_init "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" train.init_from="$WORK/one/model" \
  train.steps=5 parallel.shard=full
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" one_init fsdp_init ||
  fail "train.init_from: FSDP differs from one process"
# Unpacked rows (one sample per row, padded) too.
run one_rows "$NK" finetune "${ARGS[@]}" data.pack=false
run dp2_rows "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" data.pack=false parallel.shard=optimizer
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" one_rows dp2_rows ||
  fail "unpacked rows: data parallel differs from one process"

if "${MPI[@]}" 2 "$NK" finetune "${ARGS[@]}" parallel.pp=2 train.out_dir="$WORK/pp" \
  >"$WORK/pp.log" 2>&1; then
  fail "parallel.pp=2 was not refused"
fi
grep -q "parallel.pp = 2: data.sft_path (fine-tuning) with parallel.pp under tensor or pipeline parallelism is not supported" \
  "$WORK/pp.log" || fail "the pipeline refusal does not name parallel.pp"
pass "finetune under DP (2, 4 ranks), ZeRO-1, FSDP, TP2 and TP2+SP equals one process"
