// Row passes of the softmax cross-entropy, shared by the whole-vocabulary
// kernels (cross_entropy.cc) and the vocabulary-parallel ones
// (cross_entropy_shard.cc): a row is walked in chunks of kChunk (converted
// to fp32 into an L1-resident buffer), on the vectorized online-softmax
// primitives of softmax_math.h.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "core/dtype.h"
#include "ops/cpu/level.h"
#include "ops/cpu/softmax_math.h"

namespace nk::ops::NK_CPU_NS::xent {

constexpr int64_t kChunk = 2048;  // 8 KiB of fp32: stays in L1 between the max and sum passes

// The chunk [j0, j0+n) of row x as fp32: a pointer into x itself for f32 storage.
inline const float* chunk_f32(const float* x, int64_t j0, int64_t, float*) {
  return x + j0;
}
inline const float* chunk_f32(const bf16* x, int64_t j0, int64_t n, float* buf) {
  for (int64_t j = 0; j < n; ++j) buf[j] = bf16_to_f32(x[j0 + j]);
  return buf;
}

// (max, sum of exp(x - max)) of one row of V logits, online over chunks:
// each logit read once.
template <typename T>
std::pair<float, float> row_max_sumexp(const T* x, int64_t V, float* buf) {
  float m = -INFINITY, s = 0.f;
  for (int64_t j0 = 0; j0 < V; j0 += kChunk) {
    const int64_t n = std::min(kChunk, V - j0);
    const float* c = chunk_f32(x, j0, n, buf);
    const float cm = softmax::max_of(c, n);
    if (cm > m) {
      s *= softmax::fast_exp(m - cm);
      m = cm;
    }
    s += softmax::sum_exp_shifted(c, n, m, nullptr);
  }
  return {m, s};
}

inline void store_chunk(float*, const float*, int64_t) {}  // scaled_exp wrote dx directly
inline void store_chunk(bf16* dx, const float* buf, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dx[j] = f32_to_bf16(buf[j]);
}
inline float* grad_dst(float* dx, float*) {
  return dx;
}
inline float* grad_dst(bf16*, float* buf) {
  return buf;
}

// dlogits row = (exp(x - lse) - onehot(t)) * g, chunk by chunk; t outside
// [0, V) (the target in another shard's columns): no one-hot here. Each
// element is read before it is written, so dx may be x.
template <typename T>
void row_grad(T* dx, const T* x, int64_t V, float lse, int64_t t, float g, float* buf) {
  const bool here = t >= 0 && t < V;
  const float xt = here ? to_f32(x[t]) : 0.f;  // x[t] may be overwritten
  for (int64_t j0 = 0; j0 < V; j0 += kChunk) {
    const int64_t n = std::min(kChunk, V - j0);
    softmax::scaled_exp(chunk_f32(x, j0, n, buf), n, lse, g, grad_dst(dx + j0, buf));
    store_chunk(dx + j0, buf, n);
  }
  if (here) dx[t] = from_f32<T>((softmax::fast_exp(xt - lse) - 1.f) * g);
}

}  // namespace nk::ops::NK_CPU_NS::xent
