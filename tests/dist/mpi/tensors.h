// Small tensor helpers for the multi-process tests: build CPU tensors from
// values, read them back as f32 or i64.
#pragma once
#include <cstring>
#include <vector>

#include "core/tensor.h"

namespace nk::test {

inline Tensor tensor_f32(const std::vector<float>& v, DType dtype = DType::F32) {
  Tensor t = Tensor::empty({int64_t(v.size())}, dtype);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::F32)
      t.data<float>()[i] = v[i];
    else if (dtype == DType::BF16)
      t.data<bf16>()[i] = f32_to_bf16(v[i]);
    else if (dtype == DType::F64)
      t.data<double>()[i] = v[i];
    else if (dtype == DType::I32)
      t.data<int32_t>()[i] = int32_t(v[i]);
    else
      t.data<int64_t>()[i] = int64_t(v[i]);
  }
  return t;
}

inline std::vector<float> values(const Tensor& t) {
  std::vector<float> v(t.numel());
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype() == DType::F32)
      v[i] = t.data<float>()[i];
    else if (t.dtype() == DType::BF16)
      v[i] = bf16_to_f32(t.data<bf16>()[i]);
    else if (t.dtype() == DType::F64)
      v[i] = float(t.data<double>()[i]);
    else if (t.dtype() == DType::I32)
      v[i] = float(t.data<int32_t>()[i]);
    else
      v[i] = float(t.data<int64_t>()[i]);
  }
  return v;
}

}  // namespace nk::test
