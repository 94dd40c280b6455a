#!/usr/bin/env bash
# Data-parallel step time on this host: one process against DP2 (mpirun -np 2)
# with the gradient all-reduce overlapped with the backward and not. Each run
# trains the same global batch; the figures are the median step time and the
# median time the step waited for gradients after the backward (`comm_ms`)
# over steps 3..N of rank 0's metrics.jsonl.
#   bench/run_ddp_bench.sh [BUILD_DIR] [STEPS]
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-10}
NK=$BUILD/bin/nekton
OUT=$(mktemp -d /tmp/nk_ddp_bench.XXXXXX)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# GPT-2 (learned positions, GELU, tied head) at 6 layers, d_model 512, byte
# tokens: 19M parameters, 76 MB of f32 gradients per step.
ARGS=(model.preset=gpt2-124m model.n_layer=6 model.d_model=512 model.n_head=8 model.d_ff=2048
      model.vocab_size=512 data.path=README.md train.dtype=f32 train.micro_batch=4
      train.seq_len=128 train.global_batch=8 train.steps=$STEPS train.val_every=0
      train.log_every=1000 train.peak_tflops=1 train.threads=1 parallel.bucket_mb=25)
median() { python3 -c "import json,sys,statistics as s
r=[json.loads(l) for l in open(sys.argv[1])][2:]
print('%.0f %.0f' % (s.median(x['step_ms'] for x in r), s.median(x.get('comm_ms',0) for x in r)))" "$1"; }
run() {  # name, launcher...: prints name, median step ms, median comm ms
  local name=$1 dir=$OUT/$1.$round; shift
  "$@" "${ARGS[@]}" train.out_dir=$dir >/dev/null 2>$dir.log
  echo "$name $(median $dir/metrics.jsonl)"
}
for round in 1 2; do
  run one_process $NK train
  run dp2_overlap mpirun -np 2 --bind-to none $NK train parallel.overlap_grad_reduce=true
  run dp2_no_overlap mpirun -np 2 --bind-to none $NK train parallel.overlap_grad_reduce=false
done
rm -rf "$OUT"
