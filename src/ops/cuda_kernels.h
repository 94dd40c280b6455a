// The CUDA backend's kernels as a table of pointers, the one NK_KERNEL reads
// for Device::CUDA (ops/dispatch.h): filled from ops/cuda/kernels.h by
// ops/cuda/kernel_table.cc, and swapped for ops/kernel_profile.h's timing
// wrappers while train.profile runs, as the CPU's table is
// (ops/cpu_kernels.h). Only in a CUDA build (NK_WITH_CUDA).
#pragma once
#include "core/tensor.h"

namespace nk::ops {
struct AdamWParams;
struct MoeRouteSpec;

struct CudaKernels {
#define NK_KERNEL_DECL(ret, name, params) ret(*name) params = nullptr;
#include "ops/kernel_list.h"
};

// The backend's own kernels.
const CudaKernels& cuda_kernel_table();

// What NK_KERNEL calls: cuda_kernel_table(), or the table set_cuda_kernels
// installed in its place (which must outlive its use; nullptr restores it).
const CudaKernels& cuda_kernels();
void set_cuda_kernels(const CudaKernels* table);

}  // namespace nk::ops
