// The CPU kernels' ISA levels and the choice of one at start. The build
// compiles the CPU kernel family (src/ops/cpu) once per level, each copy in
// its own namespace (ops/cpu/level.h) with a table of pointers to its kernels
// (ops/cpu_kernels.h); the first kernel call picks the best level this CPU
// and its OS support (cpuid, and xgetbv for the OS-saved vector state), or
// the one NK_CPU_ISA caps it to. There is no AMX level: AMX tiles also need
// the OS's permission (Linux: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA),
// which a VM may withhold); oneDNN asks for it itself for its GEMMs.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace nk::ops {

// In increasing order: each level's CPUs have every lower level's features.
//  avx2:        x86-64-v3 (AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE)
//  avx512:      x86-64-v4 (AVX-512 F, BW, CD, DQ, VL)
//  avx512_bf16: x86-64-v4 + AVX512_BF16 + AVX512_VNNI
enum class CpuIsa { Avx2, Avx512, Avx512Bf16 };
inline constexpr CpuIsa kCpuIsas[] = {CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16};

// "avx2", "avx512", "avx512_bf16": NK_CPU_ISA's values.
const char* cpu_isa_name(CpuIsa isa);
std::optional<CpuIsa> parse_cpu_isa(std::string_view name);

// Whether this CPU and its OS support `isa` (cpuid + xgetbv, read once).
bool cpu_isa_supported(CpuIsa isa);

// The level to run: the best of `available` (non-empty, increasing) when
// `cap` is null or empty, else the level `cap` names. nk::Error naming
// NK_CPU_ISA, the value and the levels available when `cap` names no level
// or one not in `available`.
CpuIsa choose_cpu_isa(const char* cap, std::span<const CpuIsa> available);

// The levels this CPU supports, in increasing order; the level in use, chosen
// on first call from them and the NK_CPU_ISA environment variable. When
// NK_CPU_ISA is set (and ONEDNN_MAX_CPU_ISA is not), oneDNN is capped at the
// matching level too, so its GEMMs obey the same cap.
std::span<const CpuIsa> cpu_isas_available();
CpuIsa active_cpu_isa();

// For the logs: "avx512_bf16 (available: avx2, avx512, avx512_bf16)", with
// ", capped by NK_CPU_ISA" when it is.
std::string cpu_isa_summary();

}  // namespace nk::ops
