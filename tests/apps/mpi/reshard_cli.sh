#!/usr/bin/env bash
# A checkpoint saved by `nekton train` under one data-parallel layout resumes
# under others (issue 9's resharding check): saved at step 5 of 10 by 4 ranks
# with the distributed optimizer (ZeRO-1), resumed by one process and by FSDP
# over 2 ranks. Steps 6-10 of each must give the losses of the uninterrupted
# 4-rank run within a relative 1e-5 (f32; the resumed runs add the same
# gradients in another order: the equivalence tests' tolerance).
#   tests/apps/mpi/reshard_cli.sh REPO BUILD
set -euo pipefail
REPO=$1
NK=$2/bin/nekton
W=$(mktemp -d /tmp/nk_reshard.XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
ARGS=(model.preset=llama-tiny model.n_layer=2 model.d_model=64 model.n_head=4 model.n_kv_head=2
      model.d_ff=128 data.path=$REPO/README.md train.dtype=f32 train.micro_batch=2
      train.seq_len=32 train.global_batch=8 train.steps=10 train.val_every=0
      train.peak_tflops=1 train.save_every=5 parallel.bucket_mb=0.05 parallel.timeout_s=60)
run() { timeout $((240 * ${NK_TIME_SCALE:-1})) "$@" >"$W/log" 2>&1 || { cat "$W/log"; echo "FAIL: $*"; exit 1; }; }

run mpirun -np 4 --oversubscribe "$NK" train "${ARGS[@]}" parallel.shard=optimizer \
  train.out_dir="$W/whole"
run mpirun -np 4 --oversubscribe "$NK" train "${ARGS[@]}" parallel.shard=optimizer \
  train.out_dir="$W/first" train.exit_at_step=5
CKPT=$W/first/checkpoints/step_00000005
for f in optimizer.0000{0,1,2,3}-of-00004.safetensors model.safetensors; do
  [ -f "$CKPT/$f" ] || { ls "$CKPT"; echo "FAIL: $f missing from the ZeRO-1 checkpoint"; exit 1; }
done
run "$NK" train "${ARGS[@]}" train.out_dir="$W/one" train.resume_from="$CKPT"
run mpirun -np 2 --oversubscribe "$NK" train "${ARGS[@]}" parallel.shard=full \
  train.out_dir="$W/fsdp2" train.resume_from="$CKPT"

/usr/bin/python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
def losses(run):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{w}/{run}/metrics.jsonl"))}
whole = losses("whole")
assert sorted(whole) == list(range(1, 11)), sorted(whole)
for run in ("one", "fsdp2"):
    got = losses(run)
    assert sorted(got) == list(range(6, 11)), (run, sorted(got))
    for s in range(6, 11):
        rel = abs(got[s] - whole[s]) / abs(whole[s])
        assert rel <= 1e-5, f"{run} step {s}: {got[s]} vs {whole[s]} (relative {rel:.2e})"
    print(f"{run}: steps 6-10 within 1e-5 of the 4-rank ZeRO-1 run")
PY
echo "PASS: a 4-rank ZeRO-1 checkpoint resumes under one process and under FSDP over 2"
