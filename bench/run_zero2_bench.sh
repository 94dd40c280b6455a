#!/usr/bin/env bash
# ZeRO-2 against plain DP, ZeRO-1 and FSDP on GPT-2 124M (f32, 2 ranks, one
# thread each, micro-batch 2 x 128 tokens, global batch 8: 2 micro-batches a
# rank a step), ROUNDS rounds interleaved, beside PyTorch DDP and PyTorch's
# ZeroRedundancyOptimizer (ZeRO-1) on the same shape and batch
# (bench/ddp_torch_reference.py; Debian's torch 1.13 has no ZeRO-2 on CPUs).
# Per Nekton run: rank 0's peak RSS, the most gradient bytes resident during
# a step (grad_resident_bytes, sharded gradients only), the median step time
# and exposed communication over steps 3-STEPS, and the last loss.
#   bench/run_zero2_bench.sh [BUILD_DIR] [ROUNDS] [STEPS (5)]
set -euo pipefail
NK=${1:-build}/bin/nekton
ROUNDS=${2:-2}
STEPS=${3:-5}
OUT=$(mktemp -d /tmp/nk_zero2.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
# The PyTorch reference's best BLAS on Debian (without it torch falls back to
# the reference BLAS, 20x slower here).
dpkg-query -W -f='${Status}' libopenblas0-pthread 2>/dev/null | grep -q "install ok installed" ||
  apt-get install -y -qq --no-install-recommends libopenblas0-pthread
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
ARGS=(model.preset=gpt2-124m data.path=README.md train.dtype=f32 train.micro_batch=2
      train.seq_len=128 train.global_batch=8 train.steps=$STEPS train.warmup_steps=1
      train.val_every=0 train.log_every=1000 train.save_every=0 train.threads=1)
for round in $(seq 1 "$ROUNDS"); do
  for shard in none optimizer grads full; do
    d=$OUT/${shard}_$round
    mpirun -np 2 --bind-to none "$NK" train "${ARGS[@]}" parallel.shard=$shard \
      train.out_dir=$d >$d.out 2>&1
    python3 - "$d/metrics.jsonl" "$shard" "$round" <<'PY'
import json, statistics, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
later = rs[2:]
print(f"dp2 {sys.argv[2]:9} round {sys.argv[3]} | peak RSS "
      f"{max(r['peak_rss_bytes'] for r in rs) / 2**20:.0f} MiB | gradients resident at most "
      f"{max(r.get('grad_resident_bytes', 0) for r in rs) / 2**20:.0f} MiB | step "
      f"{statistics.median(r['step_ms'] for r in later):.0f} ms | comm "
      f"{statistics.median(r['comm_ms'] for r in later):.0f} ms | loss {rs[-1]['loss']:.6f}")
PY
  done
  for opt in adamw zero1; do
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \
      /usr/bin/python3 bench/ddp_torch_reference.py 2 "$STEPS" gpt2-124m $opt
  done
done
