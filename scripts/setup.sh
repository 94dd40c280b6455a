#!/usr/bin/env bash
# Installs what Nekton needs to build, test and run, by Debian package name.
# Idempotent: does nothing when everything is already there.
set -euo pipefail
pkgs=(build-essential cmake git libgtest-dev libgmock-dev libbenchmark-dev libdnnl-dev
      libyaml-cpp-dev nlohmann-json3-dev libfmt-dev zlib1g-dev python3-torch python3-numpy
      dict-gcide clang-format libpcre2-dev libsentencepiece-dev sentencepiece
      libzstd-dev zstd libsimdjson-dev libxxhash-dev
      libicu-dev libgumbo-dev libfasttext-dev fasttext python3.11-doc libopenmpi-dev openmpi-bin
      libcpp-httplib-dev
      iproute2 procps clang libclang-rt-14-dev libomp-14-dev llvm
      fortunes fortunes-de fortunes-ru fortunes-zh fortunes-es fortunes-it fortunes-pl fortunes-cs)
# fortunes-*: multilingual text for the tokenizer parity and language id tests;
# python3.11-doc: HTML pages with their source text, for the extraction test;
# libopenmpi-dev, openmpi-bin: MPI for src/dist and mpirun for its multi-process tests;
# clang, libclang-rt-14-dev (ASan, UBSan, libFuzzer), libomp-14-dev (clang's
# OpenMP), llvm (llvm-symbolizer, for reports' stack traces): the sanitized
# build of `make sanitize-test` and `make fuzz`;
# libcpp-httplib-dev: cpp-httplib, the HTTP server of `nekton serve` (src/serve);
# iproute2, procps: `ip netns` (two hosts as network namespaces) and pgrep in the
# tests/apps/mpi scripts.
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js runs the reference tokenizers in the tests; a machine may already have
# it from elsewhere (with npm bundled), so only install Debian's when absent.
command -v node >/dev/null && command -v npm >/dev/null || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

bash "$(dirname "$0")/fetch_assets.sh"
