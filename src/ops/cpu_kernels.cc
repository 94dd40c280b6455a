#include "ops/cpu_kernels.h"

#include <atomic>

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

namespace {
std::atomic<const CpuKernels*> g_override{nullptr};
}

const CpuKernels& cpu_kernels() {
  static const CpuKernels& k = cpu_kernels_for(active_cpu_isa());
  const CpuKernels* o = g_override.load(std::memory_order_acquire);
  return o ? *o : k;
}

void set_cpu_kernels(const CpuKernels* table) {
  g_override.store(table, std::memory_order_release);
}

bool cpu_kernels_overridden() {
  return g_override.load(std::memory_order_acquire) != nullptr;
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
