#!/usr/bin/env bash
# Checks that BINARY (nekton) starts and trains on a node without the CUDA
# libraries. A CUDA build links the runtime statically (the driver, libcuda,
# is opened by the runtime when a GPU is asked for) and opens cuBLASLt and
# NCCL with dlopen when first used, so the same binary runs CPU work on a
# CPU-only node of a mixed cluster or in an image without CUDA.
#  1. None of its dynamic dependencies (ldd: its own and its libraries') is
#     the CUDA runtime, NCCL, cuBLAS(Lt), cuDNN or the driver.
#  2. Where a private mount namespace can be made (root, `unshare -m`): every
#     folder holding those libraries here is hidden under an empty tmpfs and
#     the binary trains a tiny model for 2 steps on the CPU. Skipped, saying
#     why, where the namespace cannot be made.
# Exit 1 with the offending libraries or the run's output on failure.
#   bash scripts/check_runtime_deps.sh build/bin/nekton
set -euo pipefail
bin=$(realpath "${1:?usage: check_runtime_deps.sh BINARY}")
[ -x "$bin" ] || { echo "check_runtime_deps: $bin: no such executable" >&2; exit 2; }
cuda_libs='lib(cudart|nccl|cublas|cublasLt|cuda|cudnn|nvrtc|nvJitLink)\.so'
needed=$(ldd "$bin" | awk '{print $1}')
bad=$(grep -E "^$cuda_libs" <<<"$needed" || true)
if [ -n "$bad" ]; then
  echo "$bin needs CUDA libraries at start:" >&2
  sed 's/^/  /' <<<"$bad" >&2
  exit 1
fi
echo "$bin: $(wc -l <<<"$needed") libraries at start, none of CUDA's"

# The folders the loader or the binary's dlopen could find them in.
dirs=$( (ldconfig -p | grep -E "$cuda_libs" | sed 's/.*=> //'
  ls -d /usr/local/cuda*/lib* /usr/local/cuda*/targets/*/lib 2>/dev/null | sed 's|$|/x|') |
  xargs -r -n1 dirname | sort -u)
work=$(mktemp -d /tmp/nk_runtime_deps.XXXXXX)
trap 'rm -rf "$work"' EXIT
if ! unshare -m sh -c "mount --make-rprivate / && mount -t tmpfs none '$work'" 2>/dev/null; then
  echo "skipped the run without CUDA's libraries: cannot mount in a private namespace here" \
    "(needs root, unshare and mount)"
  exit 0
fi
head -c 20000 "$(dirname "$0")/../README.md" >"$work/text.txt"
hide=""
for d in $dirs; do hide+="mount -t tmpfs none '$d' && "; done
if ! out=$(unshare -m sh -c "mount --make-rprivate / && $hide
  '$bin' train model.preset=gpt-tiny train.steps=2 train.global_batch=2 train.micro_batch=2 \
    train.seq_len=32 data.path='$work/text.txt' train.out_dir='$work/run'" 2>&1); then
  echo "$bin did not train with CUDA's libraries hidden ($dirs):" >&2
  tail -n 20 <<<"$out" >&2
  exit 1
fi
[ -d "$work/run/model" ] || { echo "no model written:" >&2; tail -n 20 <<<"$out" >&2; exit 1; }
echo "trained 2 steps with these folders hidden: $(tr '\n' ' ' <<<"$dirs")"
