#include "ops/cpu_kernels.h"

#include "ops/cpu_quant_paths.h"

namespace nk::ops {

const CpuKernels& cpu_kernels_for(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx2:
      return cpu_kernels_avx2();
    case CpuIsa::Avx512:
      return cpu_kernels_avx512();
    case CpuIsa::Avx512Bf16:
      return cpu_kernels_avx512_bf16();
  }
  return cpu_kernels_avx2();
}

const CpuKernels& cpu_kernels() {
  static const CpuKernels& k = cpu_kernels_for(active_cpu_isa());
  return k;
}

const CpuQuantPaths& cpu_quant_paths() {
  switch (active_cpu_isa()) {
    case CpuIsa::Avx2:
      return cpu_quant_paths_avx2();
    case CpuIsa::Avx512:
      return cpu_quant_paths_avx512();
    case CpuIsa::Avx512Bf16:
      return cpu_quant_paths_avx512_bf16();
  }
  return cpu_quant_paths_avx2();
}

}  // namespace nk::ops
