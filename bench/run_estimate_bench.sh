#!/usr/bin/env bash
# `nekton estimate` against two measured training steps (--measure), for a
# few shapes, sequence lengths and recompute policies: tensor memory and step
# time, estimate beside measurement.
#
# Usage: bash bench/run_estimate_bench.sh [extra key=value ...]
# Environment: THREADS (default 2), NK_DTYPE (default bf16), NEKTON (binary).
# The rates are measured into a fresh cache first (NEKTON_CACHE, default a
# temporary folder), so the run includes measuring them.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${NEKTON:-./build/bin/nekton}
THREADS=${THREADS:-2}
NK_DTYPE=${NK_DTYPE:-bf16}
PY=/usr/bin/python3
export NEKTON_CACHE=${NEKTON_CACHE:-$(mktemp -d)}
shapes=(
  "model.preset=gpt2-124m model.n_layer=4|512|4"
  "model.preset=gpt2-124m model.n_layer=4|1024|2"
  "model.preset=llama-tiny model.d_model=512 model.n_layer=6 model.vocab_size=32000 model.max_seq_len=1024|512|4"
  "model.preset=llama-1b model.n_layer=2|512|1"
)
echo "$NK_DTYPE, $THREADS threads; rates cached in $NEKTON_CACHE"
echo "| shape | T x B | recompute | tensors est / measured | step s est / measured | est / measured |"
echo "|---|---|---|---:|---:|---:|"
for s in "${shapes[@]}"; do
  IFS='|' read -r keys T B <<<"$s"
  for policy in none selective full; do
    # shellcheck disable=SC2086
    out=$("$BIN" estimate --measure --json $keys data.path=README.md data.tokenizer=bytes \
      train.dtype=$NK_DTYPE train.seq_len=$T train.micro_batch=$B train.global_batch=$B \
      train.threads=$THREADS train.recompute=$policy "$@" 2>/dev/null)
    $PY - "$keys" "$T x $B" "$policy" <<PY
import json, sys
j = json.loads('''$out''')
m = j["measured"]
est_t, got_t = j["peak_total_bytes"], m["peak_tensor_bytes"]
est_s, got_s = j["step_seconds"]["total"], m["step_seconds"]
print(f"| {sys.argv[1]} | {sys.argv[2]} | {sys.argv[3]} | {est_t/2**20:.1f} / {got_t/2**20:.1f} MiB "
      f"| {est_s:.2f} / {got_s:.2f} | {est_s/got_s:.2f}x |")
PY
  done
done
