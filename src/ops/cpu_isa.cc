#include "ops/cpu_isa.h"

#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace nk::ops {
namespace {

// The register bits of the features each level's -march assumes.
struct CpuFeatures {
  bool v3 = false;         // x86-64-v3 and the OS saves YMM state
  bool v4 = false;         // x86-64-v4 and the OS saves opmask and ZMM state
  bool bf16_vnni = false;  // AVX512_BF16 and AVX512_VNNI
};

bool bit(uint32_t r, int b) {
  return (r >> b) & 1u;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = bit(c, 12), movbe = bit(c, 22), osxsave = bit(c, 27), avx = bit(c, 28),
             f16c = bit(c, 29);
  if (!osxsave || !avx) return f;
  // XCR0: which register state the OS saves on a context switch.
  uint32_t xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool os_ymm = (xcr0_lo & 0x6u) == 0x6u;    // SSE, AVX
  const bool os_zmm = (xcr0_lo & 0xe6u) == 0xe6u;  // + opmask, ZMM0-15 high, ZMM16-31
  unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0;
  if (!__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) return f;
  unsigned a71 = 0, b71 = 0, c71 = 0, d71 = 0;
  if (a7 >= 1) __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71);
  unsigned ae = 0, be = 0, ce = 0, de = 0;
  __get_cpuid(0x80000001u, &ae, &be, &ce, &de);
  const bool bmi1 = bit(b7, 3), avx2 = bit(b7, 5), bmi2 = bit(b7, 8), lzcnt = bit(ce, 5);
  f.v3 = os_ymm && avx2 && fma && f16c && bmi1 && bmi2 && lzcnt && movbe;
  const bool avx512f = bit(b7, 16), avx512dq = bit(b7, 17), avx512cd = bit(b7, 28),
             avx512bw = bit(b7, 30), avx512vl = bit(b7, 31);
  f.v4 = f.v3 && os_zmm && avx512f && avx512dq && avx512cd && avx512bw && avx512vl;
  const bool vnni = bit(c7, 11), bf16 = bit(a71, 5);
  f.bf16_vnni = f.v4 && vnni && bf16;
  return f;
}

const CpuFeatures& features() {
  static const CpuFeatures f = detect();
  return f;
}

std::string names(std::span<const CpuIsa> isas) {
  std::string s;
  for (CpuIsa i : isas) s += (s.empty() ? "" : ", ") + std::string(cpu_isa_name(i));
  return s.empty() ? "none" : s;
}

// oneDNN's level for ours: the highest it may use under the cap.
dnnl::cpu_isa dnnl_isa(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx2:
      return dnnl::cpu_isa::avx2;
    case CpuIsa::Avx512:
      return dnnl::cpu_isa::avx512_core;
    case CpuIsa::Avx512Bf16:
      return dnnl::cpu_isa::avx512_core_bf16;
  }
  return dnnl::cpu_isa::avx2;
}

struct Active {
  CpuIsa isa;
  bool capped;
};

Active choose_active() {
  const char* cap = std::getenv("NK_CPU_ISA");
  const CpuIsa isa = choose_cpu_isa(cap, cpu_isas_available());
  const bool capped = cap && *cap;
  if (capped && !std::getenv("ONEDNN_MAX_CPU_ISA")) {
    // Refused once oneDNN has made a primitive (dnnl_matmul makes none
    // before asking for the level).
    if (dnnl::set_max_cpu_isa(dnnl_isa(isa)) != dnnl::status::success)
      NK_WARN("NK_CPU_ISA={}: oneDNN could not be capped to the same level", cap);
  }
  return {isa, capped};
}

const Active& active() {
  static const Active a = choose_active();
  return a;
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx2:
      return "avx2";
    case CpuIsa::Avx512:
      return "avx512";
    case CpuIsa::Avx512Bf16:
      return "avx512_bf16";
  }
  return "?";
}

std::optional<CpuIsa> parse_cpu_isa(std::string_view name) {
  for (CpuIsa i : kCpuIsas)
    if (name == cpu_isa_name(i)) return i;
  return std::nullopt;
}

bool cpu_isa_supported(CpuIsa isa) {
  const CpuFeatures& f = features();
  switch (isa) {
    case CpuIsa::Avx2:
      return f.v3;
    case CpuIsa::Avx512:
      return f.v4;
    case CpuIsa::Avx512Bf16:
      return f.bf16_vnni;
  }
  return false;
}

CpuIsa choose_cpu_isa(const char* cap, std::span<const CpuIsa> available) {
  if (available.empty())
    fail(
        "this CPU lacks x86-64-v3 (AVX2, FMA, F16C), the lowest CPU kernel level of this build "
        "(levels: avx2, avx512, avx512_bf16)");
  if (!cap || !*cap) return available.back();
  const std::optional<CpuIsa> want = parse_cpu_isa(cap);
  if (!want)
    fail("NK_CPU_ISA={}: unknown level (levels: avx2, avx512, avx512_bf16; this CPU has: {})", cap,
         names(available));
  for (CpuIsa i : available)
    if (i == *want) return i;
  fail("NK_CPU_ISA={}: this CPU lacks that level (it has: {})", cap, names(available));
}

std::span<const CpuIsa> cpu_isas_available() {
  static const std::vector<CpuIsa> v = [] {
    std::vector<CpuIsa> out;
    for (CpuIsa i : kCpuIsas)
      if (cpu_isa_supported(i)) out.push_back(i);
    return out;
  }();
  return v;
}

CpuIsa active_cpu_isa() {
  return active().isa;
}

std::string cpu_isa_summary() {
  const Active& a = active();
  return std::string(cpu_isa_name(a.isa)) + " (available: " + names(cpu_isas_available()) +
         (a.capped ? "; capped by NK_CPU_ISA)" : ")");
}

}  // namespace nk::ops
