#!/usr/bin/env bash
# GPT-2 124M training on a GPU, bf16, batch 16 x 1024: Nekton's CUDA backend
# and PyTorch (bench/torch_gpt2_cuda_bench.py: SDPA flash attention, fused
# AdamW, torch.compile) side by side on the same card in one session.
# Usage: bash bench/run_cuda_train_bench.sh [NEKTON_BIN] [steps]   (NK_TORCH=0: Nekton alone)
# (on the lent GPU machines the binary comes from scripts/cuda_bundle.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-./build/bin/nekton}
STEPS=${2:-12}
out=$(mktemp -d)
# Byte-level text: the repository's sources (several MB, so no epoch repeats).
find src tests docs -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.md' \) \
  -print0 | xargs -0 cat >"$out/corpus.txt"
echo "== nekton cuda bf16"
"$BIN" train --config configs/gpt2_124m.yaml data.path="$out/corpus.txt" train.device=cuda \
  train.micro_batch=16 train.seq_len=1024 train.global_batch=16 train.steps="$STEPS" \
  train.warmup_steps=2 train.log_every=1 train.peak_tflops=989 train.out_dir="$out/nk" | tail -n 4
python3 - "$out/nk/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]  # after two warm-up steps
tps = sorted(r["tokens_per_s"] for r in rows)[len(rows) // 2]
mfu = sorted(r["mfu"] for r in rows)[len(rows) // 2]
print(f"RESULT nekton cuda bf16: {tps:.0f} tokens/s (median), MFU {100*mfu:.1f}% of 989 TFLOP/s, "
      f"peak tensors {rows[-1]['peak_mem_bytes']/2**20:.0f} MiB")
PY
if [ "${NK_TORCH:-1}" = 1 ]; then
  echo "== torch cuda bf16"
  python3 bench/torch_gpt2_cuda_bench.py --batch 16 --seq 1024 --steps 10 | tail -n 2
fi
rm -rf "$out"
