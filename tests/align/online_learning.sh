#!/usr/bin/env bash
# GRPO learns a verifiable task that the format alone cannot solve (issue 38):
# a tiny Llama over bytes is fine-tuned on the answer FORMAT only (prompts
# "Q:abc" answered by a random letter of a..h, then the end of the
# document), so it answers held-out prompts right 1 time in 8. The task: the
# letter after the prompt's last one (h wraps to a). GRPO with an accuracy
# reward (the whole completion must be the one right letter) then raises the
# held-out accuracy (greedy, `nekton eval tasks` exact_match on 100 words
# never seen in training) by at least 30 points.
# With `ppo`: PPO (one generation per prompt, 150 steps) on the same model;
# `ppo_critic` the same with a critic of its own started from the SFT model
# (align.value_model): 0.66-0.88 over 4 seeds on the Zen 5 box, where the
# value head's run reached 0.89.
# With `lora`: the same for a LoRA policy (all-linear, r 16) on a wider model
# (4 layers of 256: on the 2 x 64 one LoRA cannot learn the task even by
# plain fine-tuning on the right answers, 200 steps; full weights do in 40).
# The outcome moves with the run's roundings (sampling diverges), and most
# with the SFT model it starts from. The `lora` recipe was 100 steps at
# lr 5e-3 without KL: 0.22-0.73 over levels and seeds, 0.00 from other SFT
# models, and 0.37 on an AVX2-only host (CI failed there). A LoRA policy
# left alone locks prompts onto wrong letters (entropy falls, groups of
# equal rewards give no gradient) or, at higher rates, leaves the one-letter
# format altogether; TRL's k3 KL to the SFT model (align.kl_coef=0.04) pulls
# it back, and 300-400 steps at lr 3e-3 let it learn most letters: on the
# AVX2-only host 0.48-1.0 over 9 SFT x RL seeds at 300 steps and 0.47-1.0
# over 4 at 400, where 19 other recipes spread over 0.0-0.85 (docs/cpu.md,
# "On a real AVX2-only host").
#   tests/align/online_learning.sh REPO BUILD [full|ppo|ppo_critic|lora] [KEY=VALUE...]
# KEY=VALUEs go to the RL run last (bench/run_online_spread.sh: seeds); a
# KEY=VALUE written sft:KEY=VALUE goes to the format-only SFT run instead.
set -euo pipefail
MODE=${3:-full}
EXTRA=()
SFT_EXTRA=()
for kv in "${@:4}"; do
  if [[ $kv == sft:* ]]; then SFT_EXTRA+=("${kv#sft:}"); else EXTRA+=("$kv"); fi
done
NAME=online_learning_$MODE
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/script_lib.sh"
export OMP_NUM_THREADS=2
/usr/bin/python3 - "$WORK" <<'PY'
import itertools, json, os, random, sys
w = sys.argv[1]
r = random.Random(1)
L = "abcdefgh"
words = ["".join(p) for p in itertools.product(L, repeat=3)]
r.shuffle(words)
held, train = words[:100], words[100:]
succ = lambda c: L[(L.index(c) + 1) % len(L)]
with open(f"{w}/sft.jsonl", "w") as f:
    for i in range(1000):
        f.write(json.dumps({"input": "Q:" + r.choice(train), "output": r.choice(L)}) + "\n")
with open(f"{w}/prompts.jsonl", "w") as f:
    for t in train:
        f.write(json.dumps({"prompt": "Q:" + t, "answer": succ(t[-1])}) + "\n")
os.makedirs(f"{w}/data/successor")
with open(f"{w}/data/successor/test.jsonl", "w") as f:
    for t in held:
        f.write(json.dumps({"prompt": "Q:" + t, "answer": succ(t[-1])}) + "\n")
with open(f"{w}/successor.yaml", "w") as f:
    f.write("""task: successor
dataset_path: successor
output_type: generate_until
test_split: test
doc_to_text: "{{prompt}}"
doc_to_target: "{{answer}}"
target_delimiter: ""
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
generation_kwargs:
  until: ["Q:"]
  do_sample: false
  max_gen_toks: 2
num_fewshot: 0
""")
PY
WIDTH=(model.n_layer=2 model.d_model=64 model.d_ff=128)
STEPS=(train.steps=300 train.lr=3e-3)
PEFT=()
METHOD=(align.method=grpo align.num_generations=8)
if [[ $MODE == ppo || $MODE == ppo_critic ]]; then  # one generation a prompt, a value baseline
  # With TRL's PPO default KL penalty (kl_coef 0.05): without it the policy
  # collapsed onto one letter a prompt (entropy 0.17) and stalled at 0.29 from
  # this SFT model at avx2 (issue 46); with it, 0.62-0.89 over 6 SFT x RL seeds.
  STEPS=(train.steps=150 train.lr=3e-3)
  METHOD=(align.method=ppo align.num_generations=1 align.kl_coef=0.05)
fi
if [[ $MODE == lora ]]; then
  WIDTH=(model.n_layer=4 model.d_model=256 model.d_ff=512)
  STEPS=(train.steps=400 train.lr=3e-3)
  METHOD+=(align.kl_coef=0.04)
  PEFT=(peft.method=lora peft.lora_rank=16 peft.target_modules=all-linear)
fi
MODEL=(model.arch=llama "${WIDTH[@]}" model.n_head=4 model.n_kv_head=4 model.vocab_size=257 model.max_seq_len=32 data.tokenizer=bytes
       data.chat_template=plain train.seq_len=12 train.peak_tflops=1)
run() {
  local out=$1
  shift
  timeout $((600 * ${NK_TIME_SCALE:-1})) "$@" >"$WORK/$out.log" 2>&1 || fail "$out: $*"
}
accuracy() {  # the held-out exact match of model folder $1
  run "eval_$2" "$NK" eval tasks "eval.model=$1" "eval.tasks=$WORK/successor.yaml" \
    "eval.data=$WORK/data" "eval.output=$WORK/$2.json"
  /usr/bin/python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results']['successor'];
print([v for k, v in r.items() if k.startswith('exact_match') and 'stderr' not in k][0])" \
    "$WORK/$2.json"
}
run sft "$NK" finetune "${MODEL[@]}" "data.sft_path=$WORK/sft.jsonl" train.micro_batch=32 \
  train.global_batch=32 train.steps=40 train.lr=3e-3 "train.out_dir=$WORK/sft" "${SFT_EXTRA[@]}"
GRPO=("${METHOD[@]}" "train.init_from=$WORK/sft/model" "${MODEL[@]}"
      "align.data_path=$WORK/prompts.jsonl" align.max_prompt_length=8 align.max_tokens=2
      align.reward_funcs=accuracy align.reward_accuracy.extract=regex
      "align.reward_accuracy.pattern=^([a-z])$" align.reward_accuracy.compare=exact
      align.reward_accuracy.reference=as_is train.micro_batch=64 train.global_batch=128
      "${STEPS[@]}" "${PEFT[@]}" train.log_every=50)
if [[ $MODE == ppo_critic ]]; then GRPO+=("align.value_model=$WORK/sft/model"); fi
run grpo "$NK" align "${GRPO[@]}" "train.out_dir=$WORK/grpo" "${EXTRA[@]}"
before=$(accuracy "$WORK/sft/model" sft)
after=$(accuracy "$WORK/grpo/model" grpo)
echo "held-out accuracy: format-only SFT $before, after ${METHOD[0]#align.method=} $after"
/usr/bin/python3 -c "import sys; b, a = map(float, sys.argv[1:]); sys.exit(0 if a >= b + 0.30 else 1)" \
  "$before" "$after" || fail "$MODE did not raise the held-out accuracy by 30 points ($before -> $after)"
pass "${METHOD[0]#align.method=} ($MODE) raised the held-out accuracy from $before to $after"
