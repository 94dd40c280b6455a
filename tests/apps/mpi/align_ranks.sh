#!/usr/bin/env bash
# `nekton align` under data parallelism equals one process (issue 37, item
# 8): DPO with the precomputed reference over 2 and 4 ranks, ZeRO-1, FSDP, TP2, DP2xTP2;
# a frozen-copy reference, KTO and SimPO over 2 ranks. Every step's loss,
# validation loss and TRL figures (rewards/*, logps/*, kl: global means over
# the ranks' pairs) and the exported weights within 1e-5 of one process (f32),
# 10 steps; the reference_logps.json every layout writes is the same bytes.
# Tensor parallelism (alone and under data parallelism) too, within 1e-5;
# sequence and pipeline parallelism are refused, naming the keys.
#   tests/apps/mpi/align_ranks.sh REPO BUILD
set -euo pipefail
NAME=align_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/script_lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1

/usr/bin/python3 - "$WORK" <<'PY'
import json, random, sys
r = random.Random(5)
word = lambda n: "".join(r.choice("abcdefghij") for _ in range(r.randint(1, n)))
with open(sys.argv[1] + "/pairs.jsonl", "w") as f, open(sys.argv[1] + "/kto.jsonl", "w") as k:
    for i in range(40):
        f.write(json.dumps({"prompt": f"say {word(4)}:", "chosen": " END" * r.randint(1, 2),
                            "rejected": word(6)}) + "\n")
        k.write(json.dumps({"prompt": f"say {word(4)}:", "completion": " END" if i % 2 else word(5),
                            "label": bool(i % 2)}) + "\n")
PY
ARGS=(model.preset=llama-tiny model.n_layer=2 model.d_model=64 model.n_head=4 model.n_kv_head=2
      model.d_ff=128 model.vocab_size=264 align.data_path=$WORK/pairs.jsonl align.valid_path=$WORK/pairs.jsonl
      train.dtype=f32 train.seq_len=24 train.micro_batch=2 train.global_batch=8 train.steps=10
      train.lr=1e-3 train.warmup_steps=0 train.val_every=5 train.val_batches=2
      train.peak_tflops=1 train.threads=1 parallel.bucket_mb=0.05 parallel.timeout_s=60)
run() {
  local out=$1
  shift
  timeout $((120 * ${NK_TIME_SCALE:-1})) "$@" train.out_dir="$WORK/$out" >"$WORK/$out.log" 2>&1 ||
    fail "$out: $*"
}
MPI=(mpirun --oversubscribe -np)
run one "$NK" align "${ARGS[@]}"
run dp2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}"
run dp4 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}"
run nproc2 "$NK" align --nproc 2 "${ARGS[@]}"
run zero1 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.shard=optimizer
run fsdp "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.shard=full
run tp2 "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" parallel.tp=2
run dp2tp2 "${MPI[@]}" 4 "$NK" align "${ARGS[@]}" parallel.tp=2 parallel.shard=optimizer
grep -q "data parallel: world 2" "$WORK/dp2.log" || fail "dp2 did not run data parallel"
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" one dp2 dp4 nproc2 zero1 fsdp tp2 dp2tp2 ||
  fail "a parallel DPO run differs from one process"
for r in dp2 dp4 zero1 fsdp; do
  cmp -s "$WORK/one/reference_logps.json" "$WORK/$r/reference_logps.json" ||
    fail "$r: reference_logps.json differs from one process's"
done

run one_copy "$NK" align "${ARGS[@]}" align.reference=copy
run dp2_copy "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.reference=copy parallel.shard=full
run one_kto "$NK" align "${ARGS[@]}" align.method=kto align.data_path=$WORK/kto.jsonl \
  align.valid_path=
run dp2_kto "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.method=kto \
  align.data_path=$WORK/kto.jsonl align.valid_path= parallel.shard=optimizer
run tp2_kto "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.method=kto \
  align.data_path=$WORK/kto.jsonl align.valid_path= parallel.tp=2
run one_simpo "$NK" align "${ARGS[@]}" align.method=simpo
run dp2_simpo "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" align.method=simpo
/usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" one_copy dp2_copy &&
  /usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" one_kto dp2_kto tp2_kto &&
  /usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" one_simpo dp2_simpo ||
  fail "copy reference, KTO or SimPO: data parallel differs from one process"

for bad in "parallel.tp=2 parallel.sp=true" parallel.pp=2; do
  # shellcheck disable=SC2086 # two keys in one word
  if "${MPI[@]}" 2 "$NK" align "${ARGS[@]}" $bad train.out_dir="$WORK/bad" >"$WORK/bad.log" 2>&1
  then
    fail "$bad was not refused"
  fi
  grep -q "parallel.sp, parallel.cp, parallel.ep, parallel.pp: nekton align runs under data and tensor parallelism only" \
    "$WORK/bad.log" || fail "$bad: the refusal does not name the keys"
done
pass "align (DPO, copy reference, KTO, SimPO) under DP (2, 4 ranks), ZeRO-1, FSDP, TP2 and DP2xTP2 equals one process"
