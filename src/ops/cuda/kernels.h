// The CUDA backend's kernels (src/ops/cuda/*.cu), one per public op of ops.h
// under the same name as the CPU's (ops/cpu/kernels.h), reached through
// NK_KERNEL when the op's tensors live on Device::CUDA. Every kernel runs on
// the compute stream (core/cuda/runtime.h) and returns without waiting for
// the device, except those that hand a value or bytes to the host.
// Semantics and layouts are ops.h's; like the CPU kernels they check what
// they read from tensor memory (token ids, targets, positions) on the device
// and report a bad one as an nk::Error.
//
// Absent on CUDA (their fronts call the CPU kernel alone, so a CUDA tensor
// gets "no kernel for device 'cuda'"): the NF4 and int8/int4 quantised
// weights of ops/quant.h, the NF4 ops of ops.h, and rope_table (the table is
// built in host memory and moved with ops::to_device): the CPU's own list,
// ops/cpu/cpu_only_kernel_list.h.
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace nk::ops {
struct AdamWParams;
struct MoeRouteSpec;
}  // namespace nk::ops

namespace nk::ops::cuda {

#define NK_KERNEL_DECL(ret, name, params) ret name params;
#include "ops/kernel_list.h"

// The cuBLASLt library the GEMMs call, opened now if no GEMM has opened it
// yet (it is loaded at first use, not linked), with its version; throws
// nk::Error naming the library when it cannot be opened. Needs no GPU.
std::string cublaslt_library();

}  // namespace nk::ops::cuda
