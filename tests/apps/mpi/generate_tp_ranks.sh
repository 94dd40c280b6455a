#!/usr/bin/env bash
# `nekton generate` split by tensor parallelism (generate.tp=2, launched by
# --nproc 2 or by mpirun) equals one process: the same sampled tokens and
# per-token log-probabilities within 1e-4 (f32; only the order of the
# row-parallel sums differs), for several prompts decoded in a batch and for
# one streamed prompt, on a Llama (grouped-query attention), a
# Mixtral-style model (each rank its half of every expert) and DeepSeek-V3
# (latent attention), each fine-tuned here for two steps. What it cannot
# run is refused naming the key: generate.tp without that many processes,
# --nproc other than generate.tp, quantised weights, heads the ranks do not
# divide.
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
for m in llama mixtral deepseek; do
  BATCH=("generate.model=$WORK/$m/model" 'generate.prompt=["repeat abc:", "repeat j:", "say hi"]'
         generate.max_tokens=12 generate.ignore_eos=true generate.temperature=1.0
         generate.seed=5 generate.logprobs=2 generate.format=jsonl generate.batch_size=2)
  gen "${m}_one" "$NK" generate "${BATCH[@]}"
  gen "${m}_tp2" "$NK" generate --nproc 2 generate.tp=2 "${BATCH[@]}"
  gen "${m}_mpirun" "${MPI[@]}" 2 "$NK" generate generate.tp=2 "${BATCH[@]}"
  /usr/bin/python3 - "$WORK/${m}_one.out" "$WORK/${m}_tp2.out" "$WORK/${m}_mpirun.out" <<'PY' ||
import json, sys
runs = [[json.loads(l) for l in open(p) if l.startswith("{")] for p in sys.argv[1:]]
assert len(runs[0]) == 36, f"{len(runs[0])} tokens, want 3 prompts x 12"
for other, path in zip(runs[1:], sys.argv[2:]):
    assert len(other) == len(runs[0]), (path, len(other))
    worst = 0.0
    for a, b in zip(runs[0], other):
        assert (a["prompt"], a["step"], a["id"]) == (b["prompt"], b["step"], b["id"]), (path, a, b)
        worst = max(worst, abs(a["logprob"] - b["logprob"]))
        assert [t["id"] for t in a["top_logprobs"]] == [t["id"] for t in b["top_logprobs"]], (path, a, b)
    assert worst <= 1e-4, (path, worst)
    print(f"{path}: the same 36 tokens, max |logprob diff| {worst:.3g}")
PY
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

# What cannot run is refused, naming the key, before any generation.
M="generate.model=$WORK/llama/model"
refused_cmd no_ranks "generate.tp = 2: launch 2 processes" "$NK" generate "$M" generate.tp=2
refused_cmd nproc_tp "--nproc 2: nekton generate runs one tensor-parallel group" \
  "$NK" generate --nproc 2 "$M"
refused_cmd world_tp "generate.tp = 1: 2 processes were launched" "${MPI[@]}" 2 "$NK" generate "$M"
refused_cmd quant_tp "generate.tp = 2: not supported yet with generate.quantize=q8_0" \
  "$NK" generate --nproc 2 generate.tp=2 "$M" generate.quantize=q8_0
refused_cmd heads_tp "generate.tp = 4: model.n_kv_head = 2 is not divisible" \
  "$NK" generate --nproc 4 generate.tp=4 "$M"
pass "generate split over 2 tensor-parallel ranks (--nproc 2, mpirun) equals one process: Llama, Mixtral and DeepSeek-V3, batched and streamed; refusals name the key"
