// Host tensors made from values, for tests that build their inputs by hand.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace nk::test {

inline Tensor i32_tensor(const Shape& s, const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(s, DType::I32);
  ops::copy_bytes_from_host(t, v.data());
  return t;
}

// n token ids uniform in [0, vocab), from `seed`.
inline std::vector<int32_t> random_id_list(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = int32_t(rng.below(uint64_t(vocab)));
  return v;
}

// The same as an i32 tensor of shape s.
inline Tensor random_ids(const Shape& s, int64_t vocab, uint64_t seed) {
  return i32_tensor(s, random_id_list(shape_numel(s), vocab, seed));
}

// A 1-d f32 tensor of `v`.
inline Tensor f32_tensor(const std::vector<float>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::F32);
  ops::copy_from_host(t, v.data());
  return t;
}

// A tensor's values in f32 (any float dtype, copied to the host).
inline std::vector<float> host(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  ops::copy_to_host(t, v.data());
  return v;
}

// max |got - want| / max |want|: the parity tests' relative error.
inline double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num = std::max(num, std::abs(double(got[i]) - double(want[i])));
    den = std::max(den, std::abs(double(want[i])));
  }
  return num / std::max(den, 1e-30);
}

}  // namespace nk::test
