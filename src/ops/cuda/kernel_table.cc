// The CUDA backend's table of kernels (ops/cuda_kernels.h).
#include <atomic>

#include "ops/cuda/kernels.h"
#include "ops/cuda_kernels.h"

namespace nk::ops {
namespace {
std::atomic<const CudaKernels*> g_override{nullptr};
}  // namespace

const CudaKernels& cuda_kernel_table() {
  static constexpr CudaKernels table{
#define NK_KERNEL_DECL(ret, name, params) .name = &cuda::name,
#include "ops/kernel_list.h"
  };
  return table;
}

const CudaKernels& cuda_kernels() {
  const CudaKernels* t = g_override.load(std::memory_order_acquire);
  return t ? *t : cuda_kernel_table();
}

void set_cuda_kernels(const CudaKernels* table) {
  g_override.store(table, std::memory_order_release);
}

}  // namespace nk::ops
