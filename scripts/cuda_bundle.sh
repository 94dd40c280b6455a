#!/bin/bash
# Packs CUDA-built binaries with the shared libraries they need (all but the C
# library, the driver and the CUDA toolkit's own, which the GPU machine has)
# into DIR/bundle.tar.xz (xz: the device tool carries 64 MiB), for a GPU
# machine that lacks Debian's libraries:
#   scripts/cuda_bundle.sh DIR BINARY...
# There: scripts/cuda_device_check.sh DIR
set -euo pipefail
out=$1
shift
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$out"
skip='^(linux-vdso|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|ld-linux|libgcc_s\.so|libcuda\.so|libcudart\.so|libcublas|libnccl\.so)'
for b in "$@"; do
  cp "$b" "$stage/bin/"
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $skip ]] || cp -L "$path" "$stage/lib/$name"
  done
done
# The tests open files under the build folder compiled into them: NK_BINARY_DIR,
# else the folder of the first binary.
echo "${NK_BINARY_DIR:-$(dirname "$(readlink -f "$1")")}" >"$stage/binary_dir"
XZ_OPT=-T0 tar cJf "$out/bundle.tar.xz" -C "$stage" bin lib binary_dir
du -h "$out/bundle.tar.xz"
