#!/bin/bash
# The GPU checks of the CUDA backend, in one run on a machine with a GPU and
# the CUDA toolkit but none of Debian's libraries (the device machines this
# project is lent): unpacks the bundle that scripts/cuda_bundle.sh made here
# (test_ops, test_core, test_train, test_apps, test_nn, nekton, bench_cuda_ops),
# then runs
#   1. every op test on the cuda backend against the CPU reference (test_ops),
#      the runtime tests (test_core) and whole training runs on cuda against
#      the CPU and across a checkpoint resume (test_train's CudaTraining),
#      generate and eval on cuda against the CPU (test_apps' CudaCli), the
#      MoE layer on cuda against the CPU (test_nn's MoE.CudaMatchesTheCpu);
#   2. `nekton train` on cuda through the command line (checkpoint and export);
#   3. with NK_BENCH=1: bench_cuda_ops, bench/run_cuda_train_bench.sh on
#      each of NK_BENCH_MODELS (default: GPT-2 124M and the ~1B Llama, Nekton
#      against PyTorch on the same card; NK_BENCH_TORCH=0: Nekton alone,
#      NK_BENCH_TORCH_MODELS: PyTorch on those models only), and
#      GPT-2 124M's step kernel by kernel (train.profile);
#   4. with NK_DIAG=1: compute-sanitizer's initcheck over the resume test and
#      racecheck over the attention tests;
#   5. unless NK_SKIP_SANITIZER=1: compute-sanitizer's memcheck over the op tests.
# Usage: scripts/cuda_device_check.sh BUNDLE_DIR [OUT_DIR]
set -uo pipefail
bundle=$1
out=${2:-${OUT:-/tmp/nk_out}}
mkdir -p "$out" /tmp/nk
# bundle.tar.xz: binaries and libraries; overlay.tar.xz (optional): other
# builds of some binaries over them (a variant checked in the same call).
# Python's tarfile where tar has no xz.
unpack() {
  tar xJf "$1" -C /tmp/nk 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" /tmp/nk
}
[ -f "$bundle/bundle.tar.xz" ] && unpack "$bundle/bundle.tar.xz"
[ -f "$bundle/overlay.tar.xz" ] && unpack "$bundle/overlay.tar.xz"
# The tests' NK_BINARY_DIR, as on the machine that built them, with the
# nekton binary where the command-line tests run it.
bindir=$(cat /tmp/nk/binary_dir)
mkdir -p "$bindir/bin" && ln -sf /tmp/nk/bin/nekton "$bindir/bin/nekton"
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

echo "[${SECONDS}s] == 1. op tests on cuda, runtime tests, training on cuda against the cpu"
"$B/test_ops" --gtest_filter='*/cuda' --gtest_brief=1 2>&1 | tee "$out/test_ops_cuda.log" | tail -40
"$B/test_core" --gtest_filter='Cuda*' --gtest_brief=1 2>&1 | tee "$out/test_core_cuda.log" | tail -8
"$B/test_train" --gtest_filter='CudaTraining*' 2>&1 | tee "$out/test_train_cuda.log" | tail -25
[ -x "$B/test_apps" ] && "$B/test_apps" --gtest_filter='CudaCli*' 2>&1 | tee "$out/test_apps_cuda.log" | tail -25
[ -x "$B/test_nn" ] && "$B/test_nn" --gtest_filter='*Cuda*' 2>&1 | tee "$out/test_nn_cuda.log" | tail -8

echo "[${SECONDS}s] == 2. nekton train on cuda from the command line"
# A fixed corpus (README.md changes from commit to commit; its losses would too).
for i in $(seq 3000); do echo "Line $((i * 7919 % 1000)) of a corpus whose numbers repeat."; done >/tmp/corpus.txt
"$B/nekton" train --config configs/llama_tiny.yaml data.path=/tmp/corpus.txt \
  train.steps=10 train.log_every=5 train.val_every=5 train.micro_batch=8 train.global_batch=8 \
  train.device=cuda train.out_dir=/tmp/run_cuda >"$out/train_cli_cuda.log" 2>&1
echo "exit $?"; tail -4 "$out/train_cli_cuda.log"

if [ "${NK_BENCH:-0}" = 1 ]; then
  echo "[${SECONDS}s] == 3. benchmarks"
  "$B/bench_cuda_ops" 2>&1 | tee "$out/bench_cuda_ops.log"
  [ "${NK_BENCH_TORCH:-1}" = 1 ] && torch=1 || torch=0
  for m in ${NK_BENCH_MODELS:-gpt2-124m llama-1b}; do
    t=$torch
    [ -n "${NK_BENCH_TORCH_MODELS+x}" ] && { [[ " $NK_BENCH_TORCH_MODELS " == *" $m "* ]] && t=1 || t=0; }
    MODEL=$m NK_TORCH=$t bash bench/run_cuda_train_bench.sh "$B/nekton" 12 2>&1 |
      tee "$out/cuda_train_bench_$m.log" | grep -E "^RESULT|^torch|Error|error" | head -5
  done
  echo "[${SECONDS}s] == where GPT-2 124M's step goes on the GPU (train.profile)"
  "$B/nekton" train --config configs/gpt2_124m.yaml data.path=/tmp/corpus.txt train.device=cuda \
    train.micro_batch=16 train.seq_len=1024 train.global_batch=16 train.steps=6 \
    train.log_every=100 train.profile=true train.out_dir=/tmp/run_profile >"$out/profile_gpt2.log" 2>&1
  echo "exit $?"; grep -A40 "profile (" "$out/profile_gpt2.log" | head -45
fi

if [ "${NK_DIAG:-0}" = 1 ]; then
  echo "[${SECONDS}s] == diagnosis: initcheck over the resume test, racecheck over the attention tests"
  timeout 150 compute-sanitizer --tool initcheck --print-limit 10 "$B/test_train" \
    --gtest_filter='CudaTraining.Resumes*' >"$out/initcheck.log" 2>&1
  echo "initcheck exit $?"; grep -E "ERROR SUMMARY|Uninitialized|at 0x|by thread|FAILED|PASSED" "$out/initcheck.log" | head -30
  timeout 120 compute-sanitizer --tool racecheck --print-limit 10 "$B/test_ops" \
    --gtest_filter='*Attention*/cuda' --gtest_brief=1 >"$out/racecheck.log" 2>&1
  echo "racecheck exit $?"; grep -E "ERROR SUMMARY|hazard|FAILED|PASSED" "$out/racecheck.log" | head -20
fi

if [ "${NK_SKIP_SANITIZER:-0}" != 1 ]; then
  echo "[${SECONDS}s] == 4. compute-sanitizer memcheck over the op tests"
  timeout "${NK_SANITIZER_SECONDS:-150}" compute-sanitizer --tool memcheck --print-limit 20 \
    "$B/test_ops" --gtest_filter="${NK_SANITIZER_FILTER:-*/cuda}" --gtest_brief=1 >"$out/memcheck.log" 2>&1
  echo "memcheck exit $?"; grep -E "ERROR SUMMARY|Invalid|FAILED|PASSED" "$out/memcheck.log" | head -20
fi
