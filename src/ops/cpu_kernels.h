// The CPU backend's kernels as a table of pointers, one table per ISA level
// (ops/cpu_isa.h): the same X-macro lists as ops/cpu/kernels.h's
// declarations (ops/kernel_list.h, ops/cpu/cpu_only_kernel_list.h), expanded
// as fields here and filled by each level's copy of ops/cpu/kernel_table.cc
// with that copy's kernels. The fronts call cpu_kernels(), the active level's.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/cpu_isa.h"

namespace nk::ops {
struct AdamWParams;
struct MoeRouteSpec;
struct Nf4Weight;
struct QuantWeight;

struct CpuKernels {
#define NK_KERNEL_DECL(ret, name, params) ret(*name) params = nullptr;
#include "ops/kernel_list.h"

#define NK_KERNEL_DECL(ret, name, params) ret(*name) params = nullptr;
#include "ops/cpu/cpu_only_kernel_list.h"
};

// Each level's table (defined by its copy of ops/cpu/kernel_table.cc); only
// call a level's kernels on a CPU that supports it (cpu_isa_supported).
const CpuKernels& cpu_kernels_avx2();
const CpuKernels& cpu_kernels_avx512();
const CpuKernels& cpu_kernels_avx512_bf16();
const CpuKernels& cpu_kernels_for(CpuIsa isa);

// The table of active_cpu_isa(), chosen on first call (nk::Error when
// NK_CPU_ISA names no level or one this CPU lacks), or the table
// set_cpu_kernels installed in its place.
const CpuKernels& cpu_kernels();

// Installs `table` (which must outlive its use) in place of the active
// level's; nullptr restores that one. For ops/kernel_profile.h's timing
// wrappers, which call the level's own kernels.
void set_cpu_kernels(const CpuKernels* table);
bool cpu_kernels_overridden();

}  // namespace nk::ops
