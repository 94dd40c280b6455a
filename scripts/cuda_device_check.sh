#!/bin/bash
# The GPU checks of the CUDA backend, in one run on a machine with a GPU and
# the CUDA toolkit but none of Debian's libraries (the device machines this
# project is lent): unpacks the bundle that scripts/cuda_bundle.sh made here,
# then runs
#   1. every op test on the cuda backend against the CPU reference (test_ops),
#      and the runtime tests (test_core's CudaRuntime);
#   2. compute-sanitizer's memcheck over the op tests;
#   3. `nekton train` of a tiny Llama on cuda and on the CPU, f32 and bf16,
#      printing both loss curves.
# Usage: scripts/cuda_device_check.sh BUNDLE_DIR [OUT_DIR]
set -uo pipefail
bundle=$1
out=${2:-${OUT:-/tmp/nk_out}}
mkdir -p "$out" /tmp/nk
tar xzf "$bundle/bundle.tar.gz" -C /tmp/nk
# The toolkit's and NCCL's libraries, wherever this machine keeps them.
libdirs=""
for n in libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libnccl.so.2; do
  f=$(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu /opt /usr/local/lib -name "$n" 2>/dev/null | head -1)
  [ -n "$f" ] && libdirs="$libdirs:$(dirname "$f")" || echo "missing $n"
done
export LD_LIBRARY_PATH="/tmp/nk/lib$libdirs"
export OMP_NUM_THREADS=8
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
B=/tmp/nk/bin

echo "== 1. op tests on cuda, runtime tests"
"$B/test_ops" --gtest_filter='*/cuda' --gtest_brief=1 2>&1 | tee "$out/test_ops_cuda.log" | tail -80
"$B/test_core" --gtest_filter='Cuda*' 2>&1 | tee "$out/test_core_cuda.log" | tail -25

if [ "${NK_SKIP_SANITIZER:-0}" != 1 ]; then
  echo "== 2. compute-sanitizer memcheck over the op tests"
  timeout 240 compute-sanitizer --tool memcheck --print-limit 20 "$B/test_ops" \
    --gtest_filter='*/cuda' --gtest_brief=1 >"$out/memcheck.log" 2>&1
  echo "memcheck exit $?"; grep -E "ERROR SUMMARY|Invalid|FAILED" "$out/memcheck.log" | head -20
fi

echo "== 3. nekton train, tiny Llama, cuda vs cpu"
for dt in f32 bf16; do
  for dev in cuda cpu; do
    "$B/nekton" train --config configs/llama_tiny.yaml data.path=README.md data.max_bytes=200000 \
      train.steps=20 train.log_every=5 train.val_every=0 train.micro_batch=8 train.global_batch=8 \
      train.dtype=$dt train.device=$dev train.out_dir=/tmp/run_${dt}_$dev >"$out/train_${dt}_$dev.log" 2>&1
    echo "$dt $dev exit $?"; grep -E "step +[0-9]+|error|Error" "$out/train_${dt}_$dev.log" | head -8
  done
done
