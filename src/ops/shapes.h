// Shape arithmetic shared by the op fronts and the kernels.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace nk::ops {

// Rows of a [..., C] tensor, its leading dimensions flattened (1 for a scalar).
inline int64_t rows_of(const Tensor& t) {
  return t.ndim() == 0 ? 1 : t.numel() / t.dim(-1);
}

}  // namespace nk::ops
