#!/usr/bin/env bash
# Context parallelism on this machine (issue 40's figures):
#  1. attention work per rank for one row of 16k tokens at cp 1, 2 and 4
#     (bench_ring_attention: simulated ranks, each rank's ring blocks timed
#     on their own with the threads given, against the whole-row kernel);
#     The all-to-all variant (parallel.cp_comm_type=a2a) per rank beside it:
#     its heads over the whole row through the one-process kernel; and the
#     all-gather one (all_gather): its queries against the whole row's K/V.
#  2. training tokens/s of a tiny Llama at 32k tokens per row, one process
#     (2 threads) against CP2 (2 ranks of 1 thread), ring (p2p),
#     all-to-all (a2a) and all-gather (all_gather), 3 steps each, the last
#     two steps' mean from metrics.jsonl.
#   Small sizes check that it works: bench/run_cp_bench.sh build 1024 2048
#   bench/run_cp_bench.sh BUILD [T_ATTN] [T_TRAIN] [THREADS]
set -euo pipefail
BUILD=${1:-build}
TA=${2:-16384}
TT=${3:-32768}
THREADS=${4:-1}
NK=$BUILD/bin/nekton
WORK=$(mktemp -d /tmp/nk_cp_bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none

echo "== attention, T=$TA, $THREADS thread(s) per rank"
OMP_NUM_THREADS=$THREADS "$BUILD/bin/bench_ring_attention" "$TA" 1

/usr/bin/python3 - "$WORK/corpus.txt" <<'PY'
import random, sys
r = random.Random(3)
words = ["water", "stone", "river", "light", "number", "garden", "quiet", "north", "signal"]
with open(sys.argv[1], "w") as f:
    for i in range(40000):
        f.write(" ".join(r.choice(words) for _ in range(12)) + ".\n")
PY
ARGS=(model.preset=llama-tiny model.n_layer=2 model.d_model=64 model.n_head=4 model.n_kv_head=2
      model.d_ff=128 model.vocab_size=264 "model.max_seq_len=$TT" "data.path=$WORK/corpus.txt"
      train.dtype=f32 "train.seq_len=$TT" train.micro_batch=1 train.global_batch=1 train.steps=3
      train.val_every=0 train.log_every=1 train.peak_tflops=1 train.save_every=0)
tokps() {  # mean tokens/s of steps 2-3
  /usr/bin/python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])];
s=[x for x in r if 'tokens_per_s' in x and x.get('step',0)>=2]; print('%.0f' % (sum(x['tokens_per_s'] for x in s)/len(s)))" "$1/metrics.jsonl"
}
echo "== training, T=$TT, tiny Llama (2 layers, d 64, 4 heads, 2 kv heads)"
OMP_NUM_THREADS=2 "$NK" train "${ARGS[@]}" "train.out_dir=$WORK/one" >"$WORK/one.log" 2>&1
grep -E "activations|step +3/" "$WORK/one.log" | sed 's/^/  one process: /'
OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe "$NK" train "${ARGS[@]}" parallel.cp=2 \
  "train.out_dir=$WORK/cp2" >"$WORK/cp2.log" 2>&1
grep -E "activations|step +3/" "$WORK/cp2.log" | head -2 | sed 's/^/  cp2: /'
OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe "$NK" train "${ARGS[@]}" parallel.cp=2 \
  parallel.cp_comm_type=a2a "train.out_dir=$WORK/cp2a2a" >"$WORK/cp2a2a.log" 2>&1
grep -E "activations|step +3/" "$WORK/cp2a2a.log" | head -2 | sed 's/^/  cp2 a2a: /'
OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe "$NK" train "${ARGS[@]}" parallel.cp=2 \
  parallel.cp_comm_type=all_gather "train.out_dir=$WORK/cp2ag" >"$WORK/cp2ag.log" 2>&1
grep -E "activations|step +3/" "$WORK/cp2ag.log" | head -2 | sed 's/^/  cp2 all_gather: /'
one=$(tokps "$WORK/one")
cp2=$(tokps "$WORK/cp2")
a2a=$(tokps "$WORK/cp2a2a")
ag=$(tokps "$WORK/cp2ag")
echo "tokens/s (steps 2-3): one process $one, cp2 $cp2, ratio $(/usr/bin/python3 -c "print('%.2f' % ($cp2/$one))")"
echo "tokens/s (steps 2-3): cp2 a2a $a2a, ratio $(/usr/bin/python3 -c "print('%.2f' % ($a2a/$one))")"
echo "tokens/s (steps 2-3): cp2 all_gather $ag, ratio $(/usr/bin/python3 -c "print('%.2f' % ($ag/$one))")"
