// Helpers shared by the quantised-weight tests (quant_test.cc: layouts,
// quantisers, embedding, bad input; quant_linear_test.cc: the products).
#pragma once
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/ops.h"
#include "ops/quant.h"

namespace nk::quant_test {

using ops::QuantType;

inline constexpr QuantType kAllTypes[] = {QuantType::Q8_0, QuantType::Q4_0,  QuantType::Q4_K,
                                          QuantType::Q6_K, QuantType::W8A16, QuantType::W8A8,
                                          QuantType::F16,  QuantType::BF16};

inline Tensor f32_tensor(const Shape& shape, const std::vector<float>& v) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::memcpy(t.raw(), v.data(), v.size() * sizeof(float));
  return t;
}

inline std::vector<float> gaussian(size_t n, uint64_t seed, double std = 1.0) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(r.normal() * std);
  return v;
}

inline ops::QuantWeight quantized(QuantType t, const Tensor& w) {
  ops::QuantWeight q = ops::QuantWeight::empty(t, w.shape());
  ops::quant_quantize(q, w);
  return q;
}

// A copy with storage of its own.
inline ops::QuantWeight copy_of(const ops::QuantWeight& q) {
  ops::QuantWeight c = ops::QuantWeight::empty(q.type, q.shape);
  std::memcpy(c.data.raw(), q.data.raw(), q.data.nbytes());
  if (q.scale.defined()) std::memcpy(c.scale.raw(), q.scale.raw(), q.scale.nbytes());
  c.layout = q.layout;
  return c;
}

inline Tensor dequantized(const ops::QuantWeight& q, DType dtype = DType::F32) {
  Tensor out = Tensor::empty(q.shape, dtype);
  ops::quant_dequantize(out, q);
  return out;
}

inline std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw()), t.nbytes());
}

}  // namespace nk::quant_test
