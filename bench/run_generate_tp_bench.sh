#!/usr/bin/env bash
# `nekton generate` on one process against the same model split over two
# tensor-parallel processes (generate.tp=2, --nproc 2) on the same cores: a
# random-init Llama 3.2 1B-shaped model (bf16 compute), 32 sampled prompts
# decoded 32 at a time and one prompt alone, 32 new tokens each; each run's
# closing line (tokens/s) and peak resident memory of its largest process.
# QUANT=TYPE (q8_0, q4_k, ...): the weights quantised as they load
# (generate.quantize), each rank its share.
#   [QUANT=TYPE] bench/run_generate_tp_bench.sh BUILD WORK
set -euo pipefail
BUILD=$1
WORK=$2
NK=$BUILD/bin/nekton
mkdir -p "$WORK"
[ -f "$WORK/model/model.safetensors" ] || "$BUILD/bin/bench_eval_tasks" --save llama-1b "$WORK/model"
python3 - "$WORK" <<'PY'
import json, random, sys
r = random.Random(3)
with open(sys.argv[1] + "/prompts32.jsonl", "w") as g:
    for i in range(32):
        g.write(json.dumps({"prompt": f"Q: what is {r.randint(10, 99)} plus {r.randint(10, 99)}? A:"}) + "\n")
PY
THREADS=$(nproc)
run() {  # NAME LAUNCH... -- the generate keys follow
  local name=$1
  shift
  /usr/bin/time -f "peak RSS %M KiB (the largest process)" -o "$WORK/$name.time" "$@" \
    >"$WORK/$name.log" 2>&1
  # (Under mpirun rank 0's stdout and stderr interleave: the closing line
  # is not always the log's last.)
  echo "$name: $(grep -aoE '\[[0-9]+ prompts.*' "$WORK/$name.log" | tail -1) $(cat "$WORK/$name.time")"
}
COMMON=("generate.model=$WORK/model" generate.dtype=bf16 generate.max_tokens=32
        generate.ignore_eos=true generate.temperature=1.0 generate.seed=1)
[ -n "${QUANT:-}" ] && COMMON+=("generate.quantize=$QUANT")
uptime
for shape in batch32 single; do
  if [ $shape = batch32 ]; then
    KEYS=("${COMMON[@]}" "generate.prompt_file=$WORK/prompts32.jsonl" generate.batch_size=32)
  else
    KEYS=("${COMMON[@]}" "generate.prompt=Q: what is 12 plus 34? A:")
  fi
  OMP_NUM_THREADS=$THREADS run "one_$shape" "$NK" generate "${KEYS[@]}"
  OMP_NUM_THREADS=$((THREADS / 2)) run "tp2_$shape" "$NK" generate --nproc 2 generate.tp=2 \
    "${KEYS[@]}"
done
uptime
