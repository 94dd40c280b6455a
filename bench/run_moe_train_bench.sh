#!/usr/bin/env bash
# A training step of a Mixture-of-Experts model against a dense model of the
# same active parameters, same tokens, same threads, one after the other in
# one session (BENCHMARKS.md "MoE training step against dense").
#   MoE:   Mixtral-style, 8 experts of 512 units, top-2 (2 x 3 x C x 512
#          active MLP weights per token, + the router's 8 x C)
#   dense: Mistral-style (the same attention, norms, RoPE), one SwiGLU MLP of
#          1024 units (3 x C x 1024: the same active MLP weights)
# both 4 layers of width 256 (8 heads, 4 key/value heads) over bytes, f32,
# micro-batch 8 x 256 tokens. Usage:
#   bash bench/run_moe_train_bench.sh [steps] [threads] [rounds]
# Prints each run's mean tokens/s over the steps after the first two, the
# CPU time of the whole run (user + sys, start-up included: on a box shared
# with other jobs it moves less than the wall time does), and the MoE / dense
# ratios per round (the runs alternate, so a load change hits both).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-8}
THREADS=${2:-2}
ROUNDS=${3:-2}
BIN=${NK_BIN:-./build/bin/nekton}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq 40); do cat README.md; done >"$out/corpus.txt"
common="data.path=$out/corpus.txt train.dtype=f32 train.micro_batch=8 train.seq_len=256
  train.global_batch=8 train.steps=$STEPS train.warmup_steps=2 train.threads=$THREADS
  train.val_every=0 train.log_every=1000 train.save_every=0 model.d_model=256 model.n_head=8
  model.n_kv_head=4 model.n_layer=4 model.max_seq_len=256"
moe="model.preset=mixtral-tiny model.num_experts=8 model.num_experts_per_tok=2 model.moe_d_ff=512"
dense="model.preset=mistral-tiny model.sliding_window=0 model.d_ff=1024 model.rope_theta=1e6"
mean_tps() {
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
print(f"{sum(r['tokens_per_s'] for r in rows) / len(rows):.0f}")
PY
}
for r in $(seq "$ROUNDS"); do
  for kind in moe dense; do
    # shellcheck disable=SC2086
    /usr/bin/time -f "%U %S" -o "$out/$kind$r.cpu" $BIN train $common ${!kind} \
      train.out_dir="$out/$kind$r" >"$out/$kind$r.log" 2>&1 || { cat "$out/$kind$r.log"; exit 1; }
    grep -m1 "parameters" "$out/$kind$r.log" | sed "s/^/[$kind] /" || true
  done
  m=$(mean_tps "$out/moe$r/metrics.jsonl")
  d=$(mean_tps "$out/dense$r/metrics.jsonl")
  mc=$(awk '{print $1 + $2}' "$out/moe$r.cpu")
  dc=$(awk '{print $1 + $2}' "$out/dense$r.cpu")
  echo "RESULT round $r: MoE $m tokens/s, dense $d tokens/s, MoE/dense $(/usr/bin/python3 -c "print(f'{$m/$d:.2f}')");" \
    "CPU s per run: MoE $mc, dense $dc, dense/MoE $(/usr/bin/python3 -c "print(f'{$dc/$mc:.2f}')")" \
    "(load: $(cut -d' ' -f1-3 /proc/loadavg))"
done
