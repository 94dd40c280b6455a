#!/usr/bin/env bash
# `nekton generate` split by tensor parallelism (generate.tp=2, launched by
# --nproc 2 or by mpirun) equals one process: the same sampled tokens and
# per-token log-probabilities within 1e-4 (f32; only the order of the
# row-parallel sums differs), for several prompts decoded in a batch and for
# one streamed prompt, on a Llama (grouped-query attention), a
# Mixtral-style model (each rank its half of every expert) and DeepSeek-V3
# (latent attention), each fine-tuned here for two steps; with the adapters
# of a PEFT fine-tune (LoRA on every linear layer of the Llama and on
# Mixtral's experts and router, IA3, bottleneck adapters, p-tuning), each
# rank its slice of them; quantised as they load (q8_0), each rank
# quantising its share; and from GGUF files (q8_0, f16, q4_k_m), each rank
# its share of the file's blocks. What it cannot run is refused naming the
# key: generate.tp without that many processes, --nproc other than
# generate.tp, a quantisation (or a GGUF) whose blocks a rank's share does
# not hold whole, heads the ranks do not divide, a bottleneck adapter on a
# column-parallel layer.
#   tests/apps/mpi/generate_tp_ranks.sh REPO BUILD
set -euo pipefail
NAME=generate_tp_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/ranks_lib.sh"

run llama "$NK" finetune "${SFT_ARGS[@]}" train.steps=2
run mixtral "$NK" finetune "${SFT_ARGS[@]/model.preset=llama-tiny/model.preset=mixtral-tiny}" \
  model.moe_d_ff=64 model.num_experts=4 train.steps=2
run deepseek "$NK" finetune "${SFT_ARGS[@]/model.preset=llama-tiny/model.preset=deepseek_v3-tiny}" \
  model.n_kv_head=4 train.steps=2

# STDOUT of `nekton generate` into $WORK/OUT.out (its log in OUT.log).
gen() {
  local out=$1
  shift
  timeout $((120 * ${NK_TIME_SCALE:-1})) "$@" >"$WORK/$out.out" 2>"$WORK/$out.log" ||
    fail "$out: $*"
}
# Every run after the first (jsonl of 3 prompts x 12 tokens) equals the first:
# the same tokens and top ids, log-probabilities within $TOL (1e-4 unless set).
same_tokens() {
  TOL=${TOL:-1e-4} /usr/bin/python3 - "$@" <<'PY'
import json, os, sys
tol = float(os.environ["TOL"])
runs = [[json.loads(l) for l in open(p) if l.startswith("{")] for p in sys.argv[1:]]
assert len(runs[0]) == 36, f"{len(runs[0])} tokens, want 3 prompts x 12"
for other, path in zip(runs[1:], sys.argv[2:]):
    assert len(other) == len(runs[0]), (path, len(other))
    worst = 0.0
    for a, b in zip(runs[0], other):
        assert (a["prompt"], a["step"], a["id"]) == (b["prompt"], b["step"], b["id"]), (path, a, b)
        worst = max(worst, abs(a["logprob"] - b["logprob"]))
        assert [t["id"] for t in a["top_logprobs"]] == [t["id"] for t in b["top_logprobs"]], (path, a, b)
    assert worst <= tol, (path, worst)
    print(f"{path}: the same 36 tokens, max |logprob diff| {worst:.3g}")
PY
}
batch_args() {  # MODEL [TEMPERATURE]
  BATCH=("generate.model=$WORK/$1/model" 'generate.prompt=["repeat abc:", "repeat j:", "say hi"]'
         generate.max_tokens=12 generate.ignore_eos=true "generate.temperature=${2:-1.0}"
         generate.seed=5 generate.logprobs=2 generate.format=jsonl generate.batch_size=2)
}
# Quantised weights quantise the activations too (8 bits a value, a scale a
# block): a partial sum that differs in its last f32 bit (the row-parallel
# sums' order) can round one activation to the next step, which moves the
# later log-probabilities of that sequence by up to ~1e-2 (seen: 5.6e-3 on
# q4_k_m). Those runs decode greedily (a near-tie of the top two logits
# would be needed to change a token) and compare within 2e-2.
QTOL=2e-2
for m in llama mixtral deepseek; do
  batch_args $m
  gen "${m}_one" "$NK" generate "${BATCH[@]}"
  gen "${m}_tp2" "$NK" generate --nproc 2 generate.tp=2 "${BATCH[@]}"
  gen "${m}_mpirun" "${MPI[@]}" 2 "$NK" generate generate.tp=2 "${BATCH[@]}"
  same_tokens "$WORK/${m}_one.out" "$WORK/${m}_tp2.out" "$WORK/${m}_mpirun.out" ||
    fail "$m: generation split over 2 tensor-parallel ranks differs from one process"
  # One prompt streams its text: the same bytes.
  ONE=("generate.model=$WORK/$m/model" "generate.prompt=repeat ab:" generate.max_tokens=16
       generate.temperature=0 generate.ignore_eos=true)
  gen "${m}_stream_one" "$NK" generate "${ONE[@]}"
  gen "${m}_stream_tp2" "$NK" generate --nproc 2 generate.tp=2 "${ONE[@]}"
  cmp -s "$WORK/${m}_stream_one.out" "$WORK/${m}_stream_tp2.out" ||
    fail "$m: the streamed text under generate.tp=2 differs from one process"
  grep -q "the model split over 2 tensor-parallel ranks" "$WORK/${m}_tp2.log" ||
    fail "$m: generate.tp=2 did not split the model"
done

# Quantised as it loads (generate.quantize=q8_0): each rank quantises its
# share of every weight matrix, whose blocks are one process's (rows whole,
# a row-parallel layer's columns cut at a multiple of 32): the same tokens.
for m in llama mixtral; do
  batch_args $m 0
  BATCH+=(generate.quantize=q8_0)
  gen "${m}_q8_one" "$NK" generate "${BATCH[@]}"
  gen "${m}_q8_tp2" "$NK" generate --nproc 2 generate.tp=2 "${BATCH[@]}"
  TOL=$QTOL same_tokens "$WORK/${m}_q8_one.out" "$WORK/${m}_q8_tp2.out" ||
    fail "$m: q8_0 generation under generate.tp=2 differs from one process"
  batch_args $m 0
  gen "${m}_greedy" "$NK" generate "${BATCH[@]}"
  /usr/bin/python3 - "$WORK/${m}_greedy.out" "$WORK/${m}_q8_tp2.out" <<'PY' ||
import json, sys
dense, q8 = ([json.loads(l) for l in open(p) if l.startswith("{")] for p in sys.argv[1:])
moved = max(abs(a["logprob"] - b["logprob"]) for a, b in zip(dense, q8))
assert moved > 1e-4 or [a["id"] for a in dense] != [b["id"] for b in q8], moved
print(f"q8_0 against the dense weights: max |logprob diff| {moved:.3g}")
PY
    fail "$m: generate.quantize=q8_0 under generate.tp=2 did not quantise (the check could not fail)"
done

# GGUF files (llama.cpp's; nekton export gguf): each rank reads its share
# of every tensor's blocks as they are (nothing requantised), the same tokens
# as one process on the file: q8_0 and f16 on the Llama, q8_0 on the
# Mixtral-style model. q4_k_m on a wider Llama (rows of 512: whole Q4_K/Q6_K
# blocks a rank) holds layer 1's q/k in Q4_K and its v in Q6_K (llama.cpp's
# rule), its fused qkv two runs that each rank cuts to its heads.
gguf_case() {  # NAME MODEL_DIR TYPE
  local name=$1 dir=$2 type=$3 tol=$QTOL temperature=0
  [[ $type == f16 ]] && tol=1e-4 temperature=1.0  # (x is not quantised: sampled, 1e-4)
  "$NK" export gguf --tokenizer bytes "$dir" "$WORK/$name.gguf" --type "$type" \
    >"$WORK/$name.export.log" 2>&1 || fail "$name: export gguf: $(tail -3 "$WORK/$name.export.log")"
  batch_args llama $temperature
  BATCH[0]="generate.model=$WORK/$name.gguf"
  gen "${name}_one" "$NK" generate "${BATCH[@]}"
  gen "${name}_tp2" "$NK" generate --nproc 2 generate.tp=2 "${BATCH[@]}"
  TOL=$tol same_tokens "$WORK/${name}_one.out" "$WORK/${name}_tp2.out" ||
    fail "$name: generation from the GGUF under generate.tp=2 differs from one process"
  grep -q "the model split over 2 tensor-parallel ranks" "$WORK/${name}_tp2.log" ||
    fail "$name: generate.tp=2 did not split the GGUF's model"
}
gguf_case llama_q8_gguf "$WORK/llama/model" q8_0
gguf_case llama_f16_gguf "$WORK/llama/model" f16
gguf_case mixtral_q8_gguf "$WORK/mixtral/model" q8_0
run wide "$NK" finetune "${SFT_ARGS[@]}" model.d_model=512 model.d_ff=1024 train.steps=1
gguf_case wide_q4km_gguf "$WORK/wide/model" q4_k_m
# A share that is not whole blocks (rows of 256 in Q4_K, 128 a rank) is
# refused naming the tensor before any process starts.
run mid "$NK" finetune "${SFT_ARGS[@]}" model.d_model=256 model.d_ff=1024 train.steps=1
"$NK" export gguf --tokenizer bytes "$WORK/mid/model" "$WORK/mid.gguf" --type q4_k \
  >"$WORK/mid.export.log" 2>&1 || fail "mid: export gguf"
refused_cmd gguf_blocks_tp "generate.model: 'h.0.attn.proj.weight' [256, 256]: a rank of 2 holds" \
  "$NK" generate --nproc 2 generate.tp=2 "generate.model=$WORK/mid.gguf" generate.prompt=hi
! grep -q "nekton rank" "$WORK/gguf_blocks_tp.log" || fail "gguf_blocks_tp: refused after launch"

# A PEFT fine-tune's adapter over the base (generate.adapter): each rank its
# slice of the adapter's tensors. Trained hard enough (lr 3e-2) that the
# adapter moves the log-probabilities, so a rank that dropped its slice
# would differ (checked: the adapter's run is not the base's).
PEFT=(train.steps=3 train.lr=3e-2)
run llama_lora "$NK" finetune "${SFT_ARGS[@]}" "${PEFT[@]}" train.init_from="$WORK/llama/model" \
  peft.method=lora peft.target_modules=all-linear
run llama_ia3 "$NK" finetune "${SFT_ARGS[@]}" "${PEFT[@]}" train.init_from="$WORK/llama/model" \
  peft.method=ia3
run llama_adapter "$NK" finetune "${SFT_ARGS[@]}" "${PEFT[@]}" \
  train.init_from="$WORK/llama/model" peft.method=adapter
run mixtral_lora "$NK" finetune "${SFT_ARGS[@]/model.preset=llama-tiny/model.preset=mixtral-tiny}" \
  model.moe_d_ff=64 model.num_experts=4 "${PEFT[@]}" train.init_from="$WORK/mixtral/model" \
  peft.method=lora peft.target_modules=all-linear peft.train_router=true
run llama_pt "$NK" finetune "${SFT_ARGS[@]}" "${PEFT[@]}" train.init_from="$WORK/llama/model" \
  peft.method=p_tuning data.pack=false
for a in llama_lora llama_ia3 llama_adapter llama_pt mixtral_lora; do
  batch_args "${a%_*}"
  BATCH+=("generate.adapter=$WORK/$a/adapter")
  gen "${a}_one" "$NK" generate "${BATCH[@]}"
  gen "${a}_tp2" "$NK" generate --nproc 2 generate.tp=2 "${BATCH[@]}"
  same_tokens "$WORK/${a}_one.out" "$WORK/${a}_tp2.out" ||
    fail "$a: generation with the adapter under generate.tp=2 differs from one process"
  /usr/bin/python3 - "$WORK/${a%_*}_one.out" "$WORK/${a}_one.out" <<'PY' ||
import json, sys
base, tuned = ([json.loads(l) for l in open(p) if l.startswith("{")] for p in sys.argv[1:])
moved = max(abs(a["logprob"] - b["logprob"]) for a, b in zip(base, tuned))
assert moved > 1e-2 or [a["id"] for a in base] != [b["id"] for b in tuned], moved
PY
    fail "$a: the adapter does not change the generation (the check could not fail)"
done

# What cannot run is refused, naming the key, before any generation.
M="generate.model=$WORK/llama/model"
refused_cmd no_ranks "generate.tp = 2: launch 2 processes" "$NK" generate "$M" generate.tp=2
refused_cmd nproc_tp "--nproc 2: nekton generate runs one tensor-parallel group" \
  "$NK" generate --nproc 2 "$M"
refused_cmd world_tp "generate.tp = 1: 2 processes were launched" "${MPI[@]}" 2 "$NK" generate "$M"
# (Experts of 32 units: q8_0's blocks of 32 on one process, 16 values a rank.)
run mixtral32 "$NK" finetune "${SFT_ARGS[@]/model.preset=llama-tiny/model.preset=mixtral-tiny}" \
  model.moe_d_ff=32 model.num_experts=4 train.steps=1
"$NK" generate "generate.model=$WORK/mixtral32/model" generate.quantize=q8_0 generate.max_tokens=2 \
  >"$WORK/quant_one.log" 2>&1 || fail "q8_0 on one process: $(tail -3 "$WORK/quant_one.log")"
refused_cmd quant_tp "generate.quantize: q8_0 quantisation over 2 tensor-parallel ranks: " \
  "$NK" generate --nproc 2 generate.tp=2 "generate.model=$WORK/mixtral32/model" \
  generate.quantize=q8_0
grep -q "has rows of 16 values on each rank, not a multiple of 32" "$WORK/quant_tp.log" ||
  fail "quant_tp: the reason is not named"
refused_cmd heads_tp "generate.tp = 4: model.n_kv_head = 2 is not divisible" \
  "$NK" generate --nproc 4 generate.tp=4 "$M"
run llama_qkv_adapter "$NK" finetune "${SFT_ARGS[@]}" train.steps=1 \
  train.init_from="$WORK/llama/model" peft.method=adapter peft.target_modules=linear_qkv
refused_cmd adapter_tp "generate.tp = 2 with generate.adapter '$WORK/llama_qkv_adapter/adapter'" \
  "$NK" generate --nproc 2 generate.tp=2 "$M" "generate.adapter=$WORK/llama_qkv_adapter/adapter"
grep -q "a column-parallel layer" "$WORK/adapter_tp.log" || fail "adapter_tp: the reason is not named"
pass "generate split over 2 tensor-parallel ranks (--nproc 2, mpirun) equals one process: Llama, Mixtral and DeepSeek-V3, batched and streamed, with LoRA, IA3, bottleneck adapters and p-tuning, q8_0, and from GGUF files; refusals name the key"
