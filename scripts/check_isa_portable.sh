#!/usr/bin/env bash
# Checks that a portable build (NK_NATIVE=OFF) runs on an x86-64-v3 CPU: no
# function of BINARY outside the AVX-512 copies of the CPU kernels
# (nk::ops::cpu_avx512*, ops/cpu/level.h) holds an AVX-512 instruction. The
# risk it guards against: an inline function or template that a baseline file
# and an AVX-512 copy both instantiate is kept once by the linker, maybe the
# AVX-512 one, which an AVX2-only CPU cannot run (SIGILL). Prints each
# offending function with one of its instructions; exit 1 if any.
#   bash scripts/check_isa_portable.sh build/bin/nekton
set -euo pipefail
bin=${1:?usage: check_isa_portable.sh BINARY}
[ -x "$bin" ] || { echo "check_isa_portable: $bin: no such executable" >&2; exit 2; }
objdump -d --no-show-raw-insn -C "$bin" | awk '
  # A function header: "0000000000401000 <name>:"
  /^[0-9a-f]+ <.*>:$/ { fn = substr($0, index($0, "<") + 1); fn = substr(fn, 1, length(fn) - 2); next }
  fn == "" || fn ~ /cpu_avx512/ { next }
  {
    ins = $0
    sub(/^[ \t]*[0-9a-f]+:[ \t]*/, "", ins)
    # Operands only AVX-512 has: zmm, the upper 16 xmm/ymm, mask registers,
    # embedded broadcast; mnemonics only EVEX encodes.
    if (ins ~ /%zmm|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|%k[0-7]\b|\{1to[0-9]+\}/ ||
        ins ~ /^(vpternlog|vperm[it]2|vmovdq[au](8|16|32|64)|k(mov|and|or|xor|not|shift|ortest|test|add|unpck)|vpmovm2|vpmov[bwdq]2m|v(extract|insert|broadcast)[if](32|64)x|vshuf[if](32|64)x|valign[dq]|vpsraq|vpmullq|vpabsq|vp(max|min)[su]q|vcvtt?p[sd]2u?qq|vcvtu?qq2p|vcvtu|vrndscale|vgetexp|vgetmant|vscalef|vfixupimm|vrange|vreduce|vrcp14|vrsqrt14|vpconflict|vplzcnt|vpopcnt[dq]|vpro[lr]|v(p)?compress|v(p)?expand|vdpbf16ps|vcvtne2ps2bf16|vcvtneps2bf16|vpdpbusd|vpdpwssd|vperm[wb] |vpshl|vpshr|vpmadd52|v(p)?blendm|vdbpsadbw|vpmultishift)/) {
      if (!(fn in seen)) { seen[fn] = 1; n++; print fn ": " ins }
    }
  }
  END { if (n) { print n " function(s) outside the AVX-512 kernel copies hold AVX-512 code" > "/dev/stderr"; exit 1 }
        print "no AVX-512 instruction outside nk::ops::cpu_avx512*" }'
