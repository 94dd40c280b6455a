#!/usr/bin/env bash
# GPT-2 124M, 8x256, bf16, 4 steps at each CPU ISA level (mean of steps 2-4).
# Usage: bash bench/run_isa_bench.sh (after building nekton); NK_CPU_ISA forces each level.
cd "$(dirname "$0")/.."
out=$(mktemp -d)
for lvl in avx2 avx512 avx512_bf16; do
  for dt in bf16; do
    NK_CPU_ISA=$lvl ./build/bin/nekton train --config configs/gpt2_124m.yaml train.dtype=$dt train.steps=4 \
      train.out_dir=$out/$lvl-$dt train.warmup_steps=2 train.threads=2 > $out/$lvl-$dt.log 2>&1
    echo "== $lvl $dt rc=$?"; grep -m3 "cpu kernels\|peak" $out/$lvl-$dt.log
    /usr/bin/python3 - "$out/$lvl-$dt/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l][1:]
print(f"RESULT {len(rows)} steps: {sum(r['tokens_per_s'] for r in rows)/len(rows):.0f} tokens/s, MFU {100*sum(r['mfu'] for r in rows)/len(rows):.1f}%")
PY
  done
done
uptime
