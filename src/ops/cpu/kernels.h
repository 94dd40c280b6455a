// The CPU backend's kernels, one per public op of ops.h and under the same
// name, called by the op fronts (src/ops/<family>.cc) through NK_KERNEL after
// the shapes, dtypes and devices are checked there. Semantics and layouts are
// those documented in ops.h; a kernel checks only what it reads from tensor
// memory (token ids, targets, positions, slots, cu_seqlens), which the front
// cannot see. The list is ops/kernel_list.h, shared with the CUDA backend
// (ops/cuda/kernels.h); the NF4 and block-quantised kernels and rope_table
// are the CPU's alone (ops/cpu/cpu_only_kernel_list.h). Both lists are
// X-macro lists, expanded here as declarations, in the namespace of the copy
// being compiled (ops/cpu/level.h: one copy per ISA level); the fronts reach
// them through the active level's table of pointers (ops/cpu_kernels.h).
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/cpu/level.h"

namespace nk::ops {
struct AdamWParams;
struct MoeRouteSpec;
struct Nf4Weight;
struct QuantWeight;
}  // namespace nk::ops

namespace nk::ops::NK_CPU_NS {

#define NK_KERNEL_DECL(ret, name, params) ret name params;
#include "ops/kernel_list.h"

#define NK_KERNEL_DECL(ret, name, params) ret name params;
#include "ops/cpu/cpu_only_kernel_list.h"

}  // namespace nk::ops::NK_CPU_NS
