#!/usr/bin/env bash
# Online RL's step split (BENCHMARKS.md, issue 38): GRPO with a LoRA policy
# (all-linear, r 16, bf16) on a random-init llama-1b (byte tokenizer: the
# bench_eval_tasks --save folder), 8 prompts x 4 generations of up to 32
# tokens per round (one optimizer step each), against `nekton generate` of
# the same 32 requests (batch 32, bf16) on the same model.
#   bench/run_online_rl_bench.sh BUILD WORK [STEPS]
# LAYOUT="--nproc 2 parallel.tp=2 train.threads=1" runs the GRPO steps over
# several ranks (under TP each tp group generates from its pieces; under
# FSDP or PP the policy is gathered whole for each round: gather_policy_s);
# SKIP_GENERATE=1 leaves out the plain generate.
set -euo pipefail
BUILD=$1
WORK=$2
STEPS=${3:-3}
NK=$BUILD/bin/nekton
mkdir -p "$WORK"
rm -rf "$WORK/grpo"
read -r -a LAYOUT <<<"${LAYOUT:-}"
[ -f "$WORK/model/model.safetensors" ] || "$BUILD/bin/bench_eval_tasks" --save llama-1b "$WORK/model"
python3 - "$WORK" <<'PY'
import json, random, sys
r = random.Random(3)
with open(sys.argv[1] + "/prompts.jsonl", "w") as f, open(sys.argv[1] + "/prompts32.jsonl", "w") as g:
    for i in range(8):
        a, b = r.randint(10, 99), r.randint(10, 99)
        p = f"Q: what is {a} plus {b}? A:"
        f.write(json.dumps({"prompt": p, "answer": str(a + b)}) + "\n")
        for _ in range(4):
            g.write(json.dumps({"prompt": p}) + "\n")
PY
export OMP_NUM_THREADS=2
uptime
# The peak resident memory of the largest process (a rank under LAYOUT).
/usr/bin/time -f "peak RSS %M KiB (the largest process)" -o "$WORK/grpo.time" \
  "$NK" align "${LAYOUT[@]}" align.method=grpo "train.init_from=$WORK/model" data.tokenizer=bytes \
  data.chat_template=plain train.dtype=bf16 peft.method=lora peft.lora_rank=16 \
  peft.target_modules=all-linear "align.data_path=$WORK/prompts.jsonl" align.max_prompt_length=32 \
  align.max_tokens=32 align.num_generations=4 align.rollout_batch_size=32 align.temperature=1.0 \
  align.reward_funcs=accuracy train.seq_len=64 train.global_batch=32 train.micro_batch=8 \
  train.steps="$STEPS" train.log_every=1 "train.out_dir=$WORK/grpo" \
  >"$WORK/grpo.log" 2>&1
grep -E "^step" "$WORK/grpo.log" | grep -oE "step +[0-9]+/[0-9]+|generate_s [0-9.]+|score_s [0-9.]+|logps_s [0-9.]+|gather_policy_s [0-9.]+|generate_tokens_per_s [0-9.]+|[0-9]+ ms|mem [0-9.]+ [GM]iB"
cat "$WORK/grpo.time"
uptime
[[ -z ${SKIP_GENERATE:-} ]] || exit 0
"$NK" generate "generate.model=$WORK/model" "generate.prompt_file=$WORK/prompts32.jsonl" \
  generate.batch_size=32 generate.max_tokens=32 generate.temperature=1.0 generate.dtype=bf16 \
  >"$WORK/generate.log" 2>&1
tail -1 "$WORK/generate.log"
