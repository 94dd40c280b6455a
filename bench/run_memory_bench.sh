#!/usr/bin/env bash
# Per-rank memory of GPT-2 124M under plain data parallelism, ZeRO-1 and FSDP
# on 1, 2 and 4 ranks (f32, 2 steps each): rank 0's "memory per rank" log line
# (weights by resident pages, gradient and optimizer arenas by size) and its
# peak RSS from metrics.jsonl.
#   bench/run_memory_bench.sh [BUILD_DIR]
set -euo pipefail
NK=${1:-build}/bin/nekton
OUT=$(mktemp -d /tmp/nk_mem124.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
ARGS=(model.preset=gpt2-124m data.path=README.md train.dtype=f32 train.micro_batch=1
      train.seq_len=128 train.global_batch=4 train.steps=2 train.val_every=0
      train.log_every=1000 train.peak_tflops=1 train.threads=1)
for layout in "1 none" "2 none" "2 optimizer" "2 full" "4 none" "4 optimizer" "4 full"; do
  set -- $layout
  d=$OUT/dp$1_$2
  mpirun -np "$1" --oversubscribe --bind-to none "$NK" train "${ARGS[@]}" parallel.shard=$2 \
    train.out_dir=$d >$d.out 2>&1
  rss=$(python3 -c "import json, sys
print(round(max(json.loads(l)['peak_rss_bytes'] for l in open(sys.argv[1])) / 2**20))" $d/metrics.jsonl)
  echo "dp$1 $2 | peak RSS $rss MiB | $(grep -ho 'memory per rank: .*' $d.out | head -1)"
done
