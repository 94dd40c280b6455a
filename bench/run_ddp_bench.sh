#!/usr/bin/env bash
# Data-parallel step time on this host: one process against DP2 and DP4
# (mpirun -np N) with the gradient all-reduce overlapped with the backward and
# not, and with the distributed optimizer (ZeRO-1). Each run trains the same
# global batch; the figures are the median step time and the median time the
# step waited for communication (`comm_ms`: gradients after the backward, and
# under ZeRO-1 the weight all-gather) over steps 3..N of rank 0's
# metrics.jsonl, and rank 0's bytes of weights, gradients and optimizer state
# (its "memory per rank" log line).
#   bench/run_ddp_bench.sh [BUILD_DIR] [STEPS]
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-10}
NK=$BUILD/bin/nekton
OUT=$(mktemp -d /tmp/nk_ddp_bench.XXXXXX)
# The PyTorch reference's best BLAS on Debian (without it torch falls back to
# the reference BLAS).
dpkg-query -W -f='${Status}' libopenblas0-pthread 2>/dev/null | grep -q "install ok installed" ||
  apt-get install -y -qq --no-install-recommends libopenblas0-pthread
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# GPT-2 (learned positions, GELU, tied head) at 6 layers, d_model 512, byte
# tokens: 19M parameters, 76 MB of f32 gradients per step.
ARGS=(model.preset=gpt2-124m model.n_layer=6 model.d_model=512 model.n_head=8 model.d_ff=2048
      model.vocab_size=512 data.path=README.md train.dtype=f32 train.micro_batch=2
      train.seq_len=128 train.global_batch=8 train.steps=$STEPS train.val_every=0
      train.log_every=1000 train.peak_tflops=1 train.threads=1 parallel.bucket_mb=25)
median() { python3 -c "import json,sys,statistics as s
r=[json.loads(l) for l in open(sys.argv[1])][2:]
print('%.0f %.0f %.0f' % (s.median(x['step_ms'] for x in r), s.median(x.get('comm_ms',0) for x in r),
                          max(x['peak_rss_bytes'] for x in r) / 2**20))" "$1"; }
run() {  # name, launcher...: prints name, median step ms, median comm ms, rank 0's peak RSS MiB, memory
  local name=$1 dir=$OUT/$1.$round; shift
  "$@" "${ARGS[@]}" train.out_dir=$dir >$dir.out 2>$dir.log
  echo "$name $(median $dir/metrics.jsonl) |$(grep -ho 'memory per rank: .*' $dir.out $dir.log | head -1)"
}
for round in 1 2; do
  run one_process $NK train
  run dp2_overlap mpirun -np 2 --bind-to none $NK train parallel.overlap_grad_reduce=true
  run dp2_no_overlap mpirun -np 2 --bind-to none $NK train parallel.overlap_grad_reduce=false
  run dp2_zero1 mpirun -np 2 --bind-to none $NK train parallel.shard=optimizer
  run dp4 mpirun -np 4 --oversubscribe --bind-to none $NK train
  run dp4_zero1 mpirun -np 4 --oversubscribe --bind-to none $NK train parallel.shard=optimizer
  run dp2_zero2 mpirun -np 2 --bind-to none $NK train parallel.shard=grads
  run dp2_fsdp mpirun -np 2 --bind-to none $NK train parallel.shard=full
  run dp4_fsdp mpirun -np 4 --oversubscribe --bind-to none $NK train parallel.shard=full
  # PyTorch DDP over gloo, same shape, batch and one thread per rank (its best
  # set-up on this machine: OpenBLAS's pthread build with OPENBLAS_CORETYPE
  # unset; OPENBLAS_NUM_THREADS=1, else its BLAS takes both cores).
  for w in 1 2; do
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \
      /usr/bin/python3 bench/ddp_torch_reference.py $w $STEPS
  done
done
# Per-rank memory with bf16 compute (3 steps each; the memory line only).
for layout in "2 none" "2 optimizer" "2 full" "4 none" "4 optimizer" "4 full"; do
  set -- $layout
  dir=$OUT/bf16_dp$1_$2
  mpirun -np "$1" --oversubscribe --bind-to none $NK train "${ARGS[@]}" train.dtype=bf16 \
    train.steps=3 parallel.shard=$2 train.out_dir=$dir >$dir.out 2>$dir.log
  echo "bf16_dp$1_$2 | $(median $dir/metrics.jsonl | cut -d' ' -f3) MiB peak RSS |$(grep -ho 'memory per rank: .*' $dir.out $dir.log | head -1)"
done
rm -rf "$OUT"
