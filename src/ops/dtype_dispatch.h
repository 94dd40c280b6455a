// Calls fn(T{}) with T the storage type of a float dtype (float, bf16, f16),
// for kernels templated on it; shared by the CPU and CUDA backends.
#pragma once
#include "core/tensor.h"

namespace nk::ops {

template <typename Fn>
void dispatch_float(DType dt, const char* op, Fn&& fn) {
  switch (dt) {
    case DType::F32:
      fn(float{});
      break;
    case DType::BF16:
      fn(bf16{});
      break;
    case DType::F16:
      fn(f16{});
      break;
    default:
      NK_CHECK(false, "{}: unsupported dtype {}", op, dtype_name(dt));
  }
}

}  // namespace nk::ops
