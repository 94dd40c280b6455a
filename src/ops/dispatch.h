// How a public op (ops.h) reaches a backend kernel. The front of each op
// (src/ops/<family>.cc) checks shapes and dtypes, asks `device_of` for the one
// device its tensors live on, then calls `NK_KERNEL(name, device)(args...)`:
// the kernel of that name in the device's backend: on the CPU the active ISA
// level's table (ops/cpu_kernels.h), on CUDA the backend's table
// (ops/cuda_kernels.h: the kernels of ops/cuda/kernels.h), listed once below. A device whose
// backend is not built, or has no such kernel, gets an nk::Error naming the op and the device.
#pragma once
#include <initializer_list>

#include "core/tensor.h"
#include "ops/cpu_kernels.h"
#include "ops/shapes.h"
#ifdef NK_WITH_CUDA
#include "ops/cuda/kernels.h"
#include "ops/cuda_kernels.h"
#endif

namespace nk::ops {

// A tensor argument of an op, the name its errors give it, and whether it may
// be undefined (an optional input, or an output the caller does not want).
struct Arg {
  const Tensor* t;
  const char* name;
  bool optional = false;
};
inline constexpr bool kOptional = true;

// The device shared by the defined tensors of `args`; each must be contiguous
// (every kernel reads dense rows) and defined unless optional. InternalError
// naming the op and the tensor otherwise.
Device device_of(const char* op, std::initializer_list<Arg> args);

// nk::Error: "OP: no kernel for device DEVICE in this build".
[[noreturn]] void no_kernel(const char* op, Device device);

// The kernel of `device` among one op's per-backend kernels (nullptr: none).
template <typename Fn>
Fn pick_kernel(const char* op, Device device, Fn cpu, Fn cuda = nullptr) {
  Fn fn = device == Device::CPU ? cpu : device == Device::CUDA ? cuda : nullptr;
  if (!fn) no_kernel(op, device);
  return fn;
}
// The same with the CUDA kernel read from its table only when `device` is
// CUDA (a CPU call reads nothing more than the CPU's table).
template <typename Fn, typename CudaFn>
Fn pick_kernel_lazy(const char* op, Device device, Fn cpu, CudaFn&& cuda) {
  return pick_kernel(op, device, cpu, device == Device::CUDA ? Fn(cuda()) : Fn(nullptr));
}

}  // namespace nk::ops

// The kernel `name` for `device`, a function pointer to call with the op's
// arguments. The backends: CPU always; a CUDA build defines NK_WITH_CUDA and
// adds its table (ops/cuda_kernels.h) here, one line for every op at once.
#ifdef NK_WITH_CUDA
#define NK_KERNEL(name, device)                                               \
  ::nk::ops::pick_kernel_lazy(#name, (device), ::nk::ops::cpu_kernels().name, \
                              [] { return ::nk::ops::cuda_kernels().name; })
#else
#define NK_KERNEL(name, device) \
  ::nk::ops::pick_kernel(#name, (device), ::nk::ops::cpu_kernels().name)
#endif
