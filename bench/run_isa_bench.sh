#!/usr/bin/env bash
# GPT-2 124M, 8x256, bf16 and fp32 at each CPU ISA level, Nekton and PyTorch
# (bench/torch_gpt2_bench.py, Debian's python3-torch with OpenBLAS) side by side.
# Usage: bash bench/run_isa_bench.sh [nekton_steps] [torch_steps] [levels...]
# NK_CPU_ISA forces Nekton's level (and caps oneDNN to it); PyTorch is capped
# the same way: ATEN_CPU_CAPABILITY for its own kernels, ONEDNN/DNNL_MAX_CPU_ISA
# for oneDNN, OPENBLAS_CORETYPE for OpenBLAS. Needs libopenblas0-pthread.
# TORCH_DTYPES (default "bf16 fp32") picks PyTorch's runs: on a CPU without
# AVX-512 its bf16 autocast falls back to a reference path (minutes a step).
cd "$(dirname "$0")/.."
NK_STEPS=${1:-5}
PT_STEPS=${2:-3}
shift 2 2>/dev/null
LEVELS=${*:-avx2 avx512 avx512_bf16}
out=$(mktemp -d)
for lvl in $LEVELS; do
  case $lvl in
    avx2) aten=avx2 dnnl=AVX2 blas=Haswell ;;
    avx512) aten=avx512 dnnl=AVX512_CORE blas=SkylakeX ;;
    avx512_bf16) aten=avx512 dnnl=AVX512_CORE_BF16 blas=Cooperlake ;;
    *) echo "unknown level $lvl" >&2; exit 2 ;;
  esac
  for dt in bf16 f32; do
    NK_CPU_ISA=$lvl ./build/bin/nekton train --config configs/gpt2_124m.yaml train.dtype=$dt \
      train.steps=$NK_STEPS train.out_dir=$out/$lvl-$dt train.warmup_steps=2 train.threads=2 \
      > $out/$lvl-$dt.log 2>&1
    echo "== nekton $lvl $dt rc=$? $(grep -m1 'cpu kernels' $out/$lvl-$dt.log)"
    grep -m1 "peak" $out/$lvl-$dt.log
    /usr/bin/python3 - "$out/$lvl-$dt/metrics.jsonl" "$lvl" "$dt" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l][2:]
print(f"RESULT nekton {sys.argv[2]} {sys.argv[3]}: {sum(r['tokens_per_s'] for r in rows)/len(rows):.0f} tokens/s, "
      f"MFU {100*sum(r['mfu'] for r in rows)/len(rows):.1f}% ({len(rows)} steps)")
PY
  done
  for dt in ${TORCH_DTYPES:-bf16 fp32}; do
    echo "== torch $lvl $dt"
    ATEN_CPU_CAPABILITY=$aten ONEDNN_MAX_CPU_ISA=$dnnl DNNL_MAX_CPU_ISA=$dnnl OPENBLAS_CORETYPE=$blas \
      /usr/bin/python3 bench/torch_gpt2_bench.py --dtype $dt --steps $PT_STEPS --warmup 1 --threads 2 2>&1 |
      tail -n 2 | sed "s/^/RESULT torch $lvl $dt: /"
  done
done
uptime
rm -rf "$out"
