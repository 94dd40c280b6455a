#!/usr/bin/env bash
# Where a GPT-2 124M training step (8x256) goes, kernel by kernel, at each CPU
# ISA level and dtype: `train.profile=true` (self time per kernel, mean of the
# steps after the first) at NK_CPU_ISA=avx2, avx512, avx512_bf16.
# Usage: bash bench/run_isa_profile.sh [steps] [levels...]  (after building nekton)
cd "$(dirname "$0")/.."
STEPS=${1:-4}
shift 1 2>/dev/null
LEVELS=${*:-avx2 avx512 avx512_bf16}
out=$(mktemp -d)
for lvl in $LEVELS; do
  for dt in bf16 f32; do
    echo "== $lvl $dt (load $(cut -d' ' -f1-3 /proc/loadavg))"
    NK_CPU_ISA=$lvl ./build/bin/nekton train --config configs/gpt2_124m.yaml train.dtype=$dt \
      train.steps=$STEPS train.out_dir=$out/$lvl-$dt train.warmup_steps=2 train.threads=2 \
      train.profile=true 2>&1 | grep -A40 "peak\|profile (" | grep -v "^step\|saved"
  done
done
rm -rf "$out"
