# shellcheck shell=bash
# Shared by the tests/apps/mpi scripts that compare `nekton finetune` and
# `nekton align` over several processes with one (finetune_ranks.sh,
# align_ranks.sh and their PEFT siblings); sourced after NAME is set, with
#   REPO, NK  the source tree and the nekton binary.
# Brings in script_lib.sh (WORK, fail, pass) and gives:
#   SFT_ARGS    a tiny Llama fine-tuned on packed prompt/answer rows
#               ($WORK/sft.jsonl, written here), f32, 10 steps of 4
#               micro-batches of 2 rows, validation at steps 5 and 10
#   ALIGN_ARGS  the same model aligned on preference pairs ($WORK/pairs.jsonl)
#               and KTO examples ($WORK/kto.jsonl, for align.data_path=)
#   MPI         mpirun --oversubscribe -np (then the count)
#   online_rl_data  writes $WORK/prompts.jsonl and $WORK/grader.py (online RL)
#   ONLINE_ARGS the tiny model's online RL over them (rounds of two steps, a
#               copy reference, the length and command rewards), method and
#               generations left to the script
#   run OUT CMD...             CMD with train.out_dir=$WORK/OUT, its log in
#                              $WORK/OUT.log; fails the test if CMD fails
#   compare REF RUN...         compare_runs.py: every RUN equals REF within 1e-5
#   compare_norm REF RUN...    the same with the weights per tensor (--tensor-norm)
#   refused OUT PATTERN CMD... CMD must fail with PATTERN (grep) in its log
#   refused_cmd OUT PATTERN CMD...  the same for a command without train.out_dir
# shellcheck source=script_lib.sh
source "$REPO/tests/apps/mpi/script_lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1

# Prompt/answer records of many lengths: each micro-batch trains a different
# number of tokens. The validation reads 24 of the 32 packed rows: the first
# ones (first-fit-decreasing) hold one long sample each, the later several.
# Preference pairs (chosen: " END" once or twice) and unpaired KTO examples.
/usr/bin/python3 - "$WORK" <<'PY'
import json, random, sys
r = random.Random(5)
with open(sys.argv[1] + "/sft.jsonl", "w") as f:
    for i in range(64):
        w = "".join(r.choice("abcdefghij") for _ in range(r.randint(1, 12)))
        f.write(json.dumps({"input": "repeat " + w + ":", "output": " " + w * r.randint(1, 3)}) + "\n")
r = random.Random(5)
word = lambda n: "".join(r.choice("abcdefghij") for _ in range(r.randint(1, n)))
with open(sys.argv[1] + "/pairs.jsonl", "w") as f, open(sys.argv[1] + "/kto.jsonl", "w") as k:
    for i in range(40):
        f.write(json.dumps({"prompt": f"say {word(4)}:", "chosen": " END" * r.randint(1, 2),
                            "rejected": word(6)}) + "\n")
        k.write(json.dumps({"prompt": f"say {word(4)}:", "completion": " END" if i % 2 else word(5),
                            "label": bool(i % 2)}) + "\n")
PY
COMMON_ARGS=(model.preset=llama-tiny model.n_layer=2 model.d_model=64 model.n_head=4
             model.n_kv_head=2 model.d_ff=128 model.vocab_size=264 train.dtype=f32
             train.micro_batch=2 train.global_batch=8 train.steps=10 train.warmup_steps=0
             train.val_every=5 train.peak_tflops=1 train.threads=1 parallel.bucket_mb=0.05
             parallel.timeout_s=60)
SFT_ARGS=("${COMMON_ARGS[@]}" "data.sft_path=$WORK/sft.jsonl" data.chat_template=plain
          data.pack=true train.seq_len=64 train.lr=3e-3 "data.sft_valid_path=$WORK/sft.jsonl"
          train.val_batches=12)
ALIGN_ARGS=("${COMMON_ARGS[@]}" "align.data_path=$WORK/pairs.jsonl"
            "align.valid_path=$WORK/pairs.jsonl" train.seq_len=24 train.lr=1e-3
            train.val_batches=2)
MPI=(mpirun --oversubscribe -np)

# Online RL's data: $WORK/prompts.jsonl (24 "say WORD:" prompts with their
# answers) and $WORK/grader.py, a command grader scoring a completion by its
# distinct characters / 10, so a group's rewards differ and every step has a
# policy gradient.
online_rl_data() {
/usr/bin/python3 - "$WORK" <<'PY'
import json, random, sys
r = random.Random(7)
with open(sys.argv[1] + "/prompts.jsonl", "w") as f:
    for i in range(24):
        w = "".join(r.choice("abcdefghij") for _ in range(r.randint(1, 6)))
        f.write(json.dumps({"prompt": f"say {w}:", "answer": w}) + "\n")
with open(sys.argv[1] + "/grader.py", "w") as f:
    f.write("import json, sys\n"
            "for line in sys.stdin:\n"
            "    c = json.loads(line)['completion']\n"
            "    print(len(set(c)) / 10.0)\n")
PY
}
ONLINE_ARGS=("${COMMON_ARGS[@]}" "align.data_path=$WORK/prompts.jsonl" align.max_prompt_length=12
             align.max_tokens=8 align.ppo_epochs=2 align.kl_coef=0.05 align.reference=copy
             align.reward_funcs=length,command align.reward_weights=0.5,1
             "align.reward_command=/usr/bin/python3 $WORK/grader.py"
             align.reward_length.max_tokens=8 align.reward_length.cache_tokens=4
             train.seq_len=20 train.lr=3e-3 train.steps=6 train.save_every=0
             align.temperature=1.2 train.eps=1e-6)

run() {
  local out=$1
  shift
  timeout $((120 * ${NK_TIME_SCALE:-1})) "$@" train.out_dir="$WORK/$out" >"$WORK/$out.log" 2>&1 ||
    fail "$out: $*"
}

compare() {
  /usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" "$WORK" "$@"
}

compare_norm() {
  /usr/bin/python3 "$REPO/tests/apps/mpi/compare_runs.py" --tensor-norm "$WORK" "$@"
}

refused() {
  local out=$1 pattern=$2
  shift 2
  refused_cmd "$out" "$pattern" "$@" train.out_dir="$WORK/$out"
}

refused_cmd() {
  local out=$1 pattern=$2
  shift 2
  if timeout $((120 * ${NK_TIME_SCALE:-1})) "$@" >"$WORK/$out.log" 2>&1; then
    fail "$out was not refused: $*"
  fi
  grep -qF -- "$pattern" "$WORK/$out.log" || fail "$out: the refusal does not say '$pattern'"
}
