#!/usr/bin/env bash
# Installs what Nekton needs, by Debian package name. Idempotent: does nothing
# when everything is already there.
#   scripts/setup.sh         building and running (`make quickstart`)
#   scripts/setup.sh --test  also what only the tests, sanitizers, fuzzers and
#                            format check use (`make test`)
#   --list (after either): print the Debian packages, one a line, and stop
set -euo pipefail
test_too=0 list=0
for a in "$@"; do
  case "$a" in
    --test) test_too=1 ;;
    --list) list=1 ;;
    *) echo "usage: scripts/setup.sh [--test] [--list]" >&2; exit 2 ;;
  esac
done

# Building and running: the compiler, CMake, the libraries every subsystem
# links (shared/DESIGN.md; libboost-dev: Boost.Beast and Asio, headers only,
# for `nekton serve`), Open MPI (src/dist, and mpirun to launch ranks),
# GCIDE, the dictionary `nekton quickstart` trains on, and cairo with a font
# (libcairo2-dev, fonts-dejavu-core) for `nekton plot`'s PNG and SVG charts.
pkgs=(build-essential cmake git pkg-config libdnnl-dev libyaml-cpp-dev nlohmann-json3-dev
      libfmt-dev zlib1g-dev libpcre2-dev libsentencepiece-dev libzstd-dev zstd libsimdjson-dev
      libxxhash-dev libicu-dev libgumbo-dev libuchardet-dev libfasttext-dev libopenmpi-dev openmpi-bin
      libboost-dev dict-gcide libcairo2-dev fonts-dejavu-core)
# Test-only:
# libgtest-dev, libgmock-dev: GoogleTest; libbenchmark-dev: bench/;
# libcpp-httplib-dev: the HTTP client of tests/serve and tests/apps;
# python3-torch, python3-numpy: the PyTorch references of the numeric tests;
# python3-jinja2, python3-yaml: the lm-evaluation-harness reference of tests/eval;
# sentencepiece (spm_encode, spm_train), fasttext: the reference tools;
# fortunes-*: multilingual text for the tokenizer parity and language id tests;
# python3.11-doc: HTML pages with their source text, for the extraction test;
# debian-reference-en: DocBook HTML with tables of linked package names, for the
# extraction test's recall against a naive all-text extraction;
# clang, libclang-rt-14-dev (ASan, UBSan, libFuzzer), libomp-14-dev (clang's
# OpenMP), llvm (llvm-symbolizer, for reports' stack traces): the sanitized
# build of `make sanitize-test` and `make fuzz`; clang-format: `make format-check`;
# iproute2, procps: `ip netns` (two hosts as network namespaces) and pgrep in the
# tests/apps/mpi scripts;
# protobuf-compiler, python3-protobuf: tests/train's independent reader of the
# TensorBoard event files (TensorBoard's Event message compiled by protoc);
# slurm-wlm, munge: the one-node Slurm cluster tests/apps/mpi/slurm_srun.sh
# starts to launch `nekton train` with srun and sbatch; curl: the guides'
# server examples that tests/docs/doctest.py runs; ccache: `make build` and the
# sanitized build reuse unchanged objects, a fresh clone's too (Makefile).
test_pkgs=(libgtest-dev libgmock-dev libbenchmark-dev libcpp-httplib-dev python3-torch python3-numpy
           python3-jinja2 python3-yaml sentencepiece
           fasttext fortunes fortunes-de fortunes-ru fortunes-zh fortunes-es fortunes-it
           fortunes-pl fortunes-cs python3.11-doc debian-reference-en clang libclang-rt-14-dev
           libomp-14-dev llvm clang-format iproute2 procps protobuf-compiler python3-protobuf
           slurm-wlm munge curl ccache)
[ "$test_too" = 1 ] && pkgs+=("${test_pkgs[@]}")
if [ "$list" = 1 ]; then
  printf '%s\n' "${pkgs[@]}"
  exit 0
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js's npm fetches the vocabulary files (and, for the tests, the reference
# implementations); a machine may already have it from elsewhere (with npm
# bundled), so only install Debian's when absent.
command -v node >/dev/null && command -v npm >/dev/null || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "$test_too" = 1 ]; then
  bash "$(dirname "$0")/fetch_assets.sh" --test
else
  bash "$(dirname "$0")/fetch_assets.sh"
fi
