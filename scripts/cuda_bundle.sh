#!/bin/bash
# Packs CUDA-built binaries with the shared libraries they need (all but the C
# library, the driver and the CUDA toolkit's own, which the GPU machine has)
# into DIR/bundle.tar.xz (xz -9, one thread: its 64 MiB window finds the CUDA
# kernels every binary repeats; the device tool carries 64 MiB), for a GPU
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
# Without their symbol tables (a third of the binaries' size; a crash there
# is read with the builds here).
strip --strip-unneeded "$stage"/bin/* "$stage"/lib/* 2>/dev/null || true
# The tests open files under the build folder compiled into them: NK_BINARY_DIR,
# else the folder of the first binary.
echo "${NK_BINARY_DIR:-$(dirname "$(readlink -f "$1")")}" >"$stage/binary_dir"
XZ_OPT="-9 -T1" tar cJf "$out/bundle.tar.xz" -C "$stage" bin lib binary_dir
du -h "$out/bundle.tar.xz"
