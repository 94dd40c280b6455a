#!/usr/bin/env bash
# Documents/s of `nekton eval tasks` end to end (BENCHMARKS.md): a randomly
# initialised llama-1b (byte tokenizer) on 8 synthetic documents in
# HellaSwag's processed schema (4 choices), eval.batch_size=8 then 1, each a
# fresh process; prints the scoring rate each run logs.
#   bench/run_eval_tasks_bench.sh BUILD WORK [PRESET]
set -euo pipefail
BUILD=$1
WORK=$2
PRESET=${3:-llama-1b}
mkdir -p "$WORK/data/hellaswag"
[ -f "$WORK/model/model.safetensors" ] || "$BUILD/bin/bench_eval_tasks" --save "$PRESET" "$WORK/model"
python3 - "$WORK/data/hellaswag/validation.jsonl" <<'PY'
import json, random, sys
r = random.Random(7)
W = "the cat sat on a mat dog ran fast into red barn with blue hat and then went home".split()
def ws(n):
    s = ""
    while len(s) < n:
        s += (" " if s else "") + r.choice(W)
    return s
with open(sys.argv[1], "w") as f:
    for i in range(16):
        f.write(json.dumps({"query": "Walking: " + ws(r.randint(48, 80)),
                            "choices": [ws(r.randint(12, 20)) for _ in range(4)],
                            "label": str(r.randint(0, 3))}) + "\n")
PY
for bs in 8 1; do
  uptime
  OMP_NUM_THREADS=2 "$BUILD/bin/nekton" eval tasks eval.model="$WORK/model" eval.tasks=hellaswag \
    eval.data="$WORK/data" eval.limit=8 eval.batch_size=$bs eval.output="$WORK/bs$bs.json" \
    eval.write_out=8 >"$WORK/bs$bs.log" 2>&1
  echo "eval.batch_size=$bs: $(grep -o 'documents in .*' "$WORK/bs$bs.log")"
done
