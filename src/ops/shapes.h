// Shape arithmetic and argument checks shared by the op fronts and the kernels.
#pragma once
#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

namespace nk::ops {

// Rows of a [..., C] tensor, its leading dimensions flattened (1 for a scalar).
inline int64_t rows_of(const Tensor& t) {
  return t.ndim() == 0 ? 1 : t.numel() / t.dim(-1);
}

// The dtypes the model computes in (the quantised products' inputs and outputs).
inline bool is_compute_dtype(DType t) {
  return t == DType::F32 || t == DType::BF16;
}

// Rows of a [..., C] tensor (leading dims flattened), checking the last dim.
inline int64_t rows_checked(const char* op, const Tensor& t, int64_t c, const char* name) {
  NK_CHECK(t.ndim() >= 1 && t.dim(-1) == c, "{}: {} is {}, last dim should be {}", op, name,
           t.desc(), c);
  return rows_of(t);
}

}  // namespace nk::ops
