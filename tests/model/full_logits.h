// The plain forward's logits at every position of one sequence: the
// reference the KV-cache paths (contiguous and paged) are checked against.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "model/transformer.h"
#include "ops/ops.h"

namespace nk::test {

// Logits f32 [T * V] of forward_all_logits over `toks` (batch 1).
inline std::vector<float> full_logits(Transformer& m, const std::vector<int32_t>& toks) {
  const int64_t T = int64_t(toks.size()), V = m.config().vocab_size;
  Activations a(m.config(), m.compute_dtype(), 1, T, false);
  Tensor t = Tensor::empty({1, T}, DType::I32), lg = Tensor::empty({T, V}, DType::F32);
  ops::copy_bytes_from_host(t, toks.data());
  m.forward_all_logits(a, t, lg);
  std::vector<float> out(size_t(T * V));
  ops::copy_to_host(lg, out.data());
  return out;
}

// max |a - b| over the RMS of b: how far a model's logits (or scores) are
// from a reference's, relative to their size. A NaN in a counts as infinite.
inline double rel_max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::isnan(a[i]) ? INFINITY : double(std::fabs(a[i] - b[i])));
    s += double(b[i]) * b[i];
  }
  return m / std::sqrt(s / double(b.size()));
}

// max |x - v[0]| over v: how far logits spread, the scale a cache's
// tolerance is read against.
inline double logit_spread(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s = std::max(s, double(std::fabs(x - v[0])));
  return s;
}

}  // namespace nk::test
