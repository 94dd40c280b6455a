#!/usr/bin/env bash
# Training on a GPU, bf16: Nekton's CUDA backend and PyTorch (SDPA flash
# attention, fused AdamW, torch.compile) side by side on the same card in one
# session, on one of two shapes:
#   MODEL=gpt2-124m (default): GPT-2 124M, batch 16 x 1024
#     (PyTorch: bench/torch_gpt2_cuda_bench.py);
#   MODEL=llama-1b: the Llama 3.2 1B shape, batch 4 x 2048
#     (PyTorch: bench/torch_llama_cuda_bench.py).
# Usage: bash bench/run_cuda_train_bench.sh [NEKTON_BIN] [steps]   (NK_TORCH=0: Nekton alone)
# (on the lent GPU machines the binary comes from scripts/cuda_bundle.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-./build/bin/nekton}
STEPS=${2:-12}
MODEL=${MODEL:-gpt2-124m}
case $MODEL in
  gpt2-124m) B=16 T=1024 torch_bench=bench/torch_gpt2_cuda_bench.py ;;
  llama-1b) B=4 T=2048 torch_bench=bench/torch_llama_cuda_bench.py ;;
  *) echo "MODEL=$MODEL: gpt2-124m or llama-1b" >&2; exit 2 ;;
esac
out=$(mktemp -d)
# Byte-level text: the repository's sources (several MB, so no epoch repeats).
find src tests docs -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.md' \) \
  -print0 | xargs -0 cat >"$out/corpus.txt"
echo "== nekton cuda bf16 $MODEL ${B}x$T"
"$BIN" train --config configs/gpt2_124m.yaml model.preset="$MODEL" data.path="$out/corpus.txt" \
  train.device=cuda train.micro_batch=$B train.seq_len=$T train.global_batch=$B \
  train.steps="$STEPS" train.warmup_steps=2 train.log_every=1 train.peak_tflops=989 \
  train.out_dir="$out/nk" | tail -n 4
python3 - "$out/nk/metrics.jsonl" "$MODEL" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]  # after two warm-up steps
tps = sorted(r["tokens_per_s"] for r in rows)[len(rows) // 2]
mfu = sorted(r["mfu"] for r in rows)[len(rows) // 2]
print(f"RESULT nekton cuda bf16 {sys.argv[2]}: {tps:.0f} tokens/s (median), MFU {100*mfu:.1f}% "
      f"of 989 TFLOP/s, peak tensors {rows[-1]['peak_mem_bytes']/2**20:.0f} MiB")
PY
if [ "${NK_TORCH:-1}" = 1 ]; then
  echo "== torch cuda bf16 $MODEL ${B}x$T"
  python3 "$torch_bench" --batch $B --seq $T --steps 10 | tail -n 2
fi
rm -rf "$out"
