#!/usr/bin/env bash
# Refactoring guard: prints the per-step losses of short training runs (GPT-2
# and Llama presets, f32 and bf16) and the SHA-256 of the HF and GGUF exports of
# their models. Run it before and after a change that must not move a number
# and diff the two outputs: they must be identical (same machine, same build
# flags; oneDNN picks kernels per CPU, so outputs differ between machines).
#   bash scripts/golden_runs.sh [BUILD_DIR] > before.txt
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
nk="$root/${1:-build}/bin/nekton"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
steps=${GOLDEN_STEPS:-50}
run() {  # NAME CONFIG ARGS...
  local name=$1 cfg=$2
  shift 2
  "$nk" train --config "$root/configs/$cfg" train.steps="$steps" train.log_every=1 \
    train.val_every=0 train.threads=2 train.peak_tflops=1 data.max_bytes=2000000 \
    train.out_dir="$work/$name" "$@" >/dev/null 2>&1
  echo "== $name"
  # loss (and grad norm) per step, from the metrics file: timing fields dropped
  /usr/bin/python3 - "$work/$name/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r:
        print(r["step"], repr(r["loss"]), repr(r.get("grad_norm")), repr(r.get("lr")))
PY
}
common=(train.micro_batch=4 train.global_batch=8 train.seq_len=64)
gpt=(model.preset=gpt-tiny model.vocab_size=257 model.n_layer=2 model.n_head=4 model.d_model=128 model.d_ff=512)
run gpt_f32 gpt2_124m.yaml "${gpt[@]}" train.dtype=f32 "${common[@]}"
run gpt_bf16 gpt2_124m.yaml "${gpt[@]}" train.dtype=bf16 "${common[@]}"
run llama_f32 llama_tiny.yaml train.dtype=f32 "${common[@]}"
run llama_bf16 llama_tiny.yaml train.dtype=bf16 "${common[@]}"
for m in gpt_f32 llama_bf16; do
  "$nk" export hf "$work/$m/model" "$work/$m.hf" >/dev/null
  echo "== export hf $m"
  (cd "$work/$m.hf" && sha256sum $(ls | sort))
done
"$nk" export gguf "$work/llama_f32/model" "$work/llama.gguf" --type f16 >/dev/null
echo "== export gguf llama_f32 f16"
sha256sum <"$work/llama.gguf"
