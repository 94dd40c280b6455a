// This level's table of kernels (ops/cpu_kernels.h): compiled in each copy of
// the CPU kernels (ops/cpu/level.h), it names that copy's functions.
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"
#include "ops/cpu/quant_blocks.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_quant_paths.h"

namespace nk::ops {

const CpuKernels& NK_CPU_CAT_(cpu_kernels_, NK_CPU_LEVEL)() {
  static constexpr CpuKernels table{
#define NK_KERNEL_DECL(ret, name, params) .name = &NK_CPU_NS::name,
#include "ops/kernel_list.h"

#define NK_KERNEL_DECL(ret, name, params) .name = &NK_CPU_NS::name,
#include "ops/cpu/cpu_only_kernel_list.h"
  };
  return table;
}

const CpuQuantPaths& NK_CPU_CAT_(cpu_quant_paths_, NK_CPU_LEVEL)() {
  static constexpr CpuQuantPaths paths{.direct = &NK_CPU_NS::quant_linear_direct,
                                       .panels = &NK_CPU_NS::quant_linear_panels,
                                       .gemm = &NK_CPU_NS::quant_linear_gemm,
                                       .gemm_available = &NK_CPU_NS::quant_gemm_available,
                                       .path = &NK_CPU_NS::quant_linear_path};
  return paths;
}

}  // namespace nk::ops
