#!/usr/bin/env bash
# Activation recompute (train.recompute): step time and peak memory of the
# same training step with none, selective and full, one after the other in
# one session, on a preset's shape (random weights, text from README.md).
#
# Usage: bash bench/run_recompute_bench.sh [preset=gpt2-124m] [seq_len=1024]
#            [micro_batch=4] [steps=4] [extra key=value ...]
#   The mean is over the steps after the first two. Extra keys go to every
#   run (model.n_layer=4 to cut a large preset down).
# Environment: THREADS (default 2), NK_DTYPE (default bf16), NEKTON (binary).
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-gpt2-124m}
SEQ=${2:-1024}
MB=${3:-4}
STEPS=${4:-4}
shift $(( $# < 4 ? $# : 4 ))
THREADS=${THREADS:-2}
NK_DTYPE=${NK_DTYPE:-bf16}
BIN=${NEKTON:-./build/bin/nekton}
PY=/usr/bin/python3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "$PRESET $* | $NK_DTYPE | $MB x $SEQ tokens | $THREADS threads | $STEPS steps (mean of those after 2)"
echo "| train.recompute | activations (planned) | peak tensors | peak RSS | tokens/s | step ms | step time vs none |"
echo "|---|---:|---:|---:|---:|---:|---:|"
base_ms=
for policy in none selective full; do
  dir=$out/$policy
  "$BIN" train model.preset=$PRESET data.path=README.md data.tokenizer=bytes \
    train.dtype=$NK_DTYPE train.micro_batch=$MB train.global_batch=$MB train.seq_len=$SEQ \
    train.steps=$STEPS train.val_every=0 train.log_every=1 train.peak_tflops=1 \
    train.threads=$THREADS train.recompute=$policy train.out_dir=$dir "$@" >"$dir.log" 2>&1 || {
    tail -n 20 "$dir.log" >&2
    exit 1
  }
  acts=$(grep -oE 'activations [0-9.]+ MiB' "$dir.log" | grep -oE '[0-9.]+')
  row=$($PY - "$dir/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = rows[2:] if len(rows) > 2 else rows[-1:]
ms = sum(r["step_ms"] for r in rows) / len(rows)
tps = sum(r["tokens_per_s"] for r in rows) / len(rows)
mem = max(r["peak_mem_bytes"] for r in rows) / 2**30
rss = max(r["peak_rss_bytes"] for r in rows) / 2**30
print(f"{mem:.2f} GiB\t{rss:.2f} GiB\t{tps:.0f}\t{ms:.0f}")
PY
)
  IFS=$'\t' read -r mem rss tps ms <<<"$row"
  [[ -z $base_ms ]] && base_ms=$ms
  ratio=$($PY -c "print(f'{$ms / $base_ms:.3f}x')")
  echo "| $policy | $acts MiB | $mem | $rss | $tps | $ms | $ratio |"
done
