// Host tensors made from values, for tests that build their inputs by hand.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

namespace nk::test {

inline Tensor i32_tensor(const Shape& s, const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(s, DType::I32);
  ops::copy_bytes_from_host(t, v.data());
  return t;
}

// A 1-d f32 tensor of `v`.
inline Tensor f32_tensor(const std::vector<float>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::F32);
  ops::copy_from_host(t, v.data());
  return t;
}

}  // namespace nk::test
