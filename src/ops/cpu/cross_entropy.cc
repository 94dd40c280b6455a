// Softmax cross-entropy kernels (arguments checked by ops/cross_entropy.cc),
// one row per task. The loss pass reads each logit once: the row is walked in
// chunks of kChunk (converted to fp32 into an L1-resident buffer), each chunk's
// max folded into a running (max, sum of exp) pair. forward_backward then makes a second pass
// writing dlogits element by element after reading it, so dlogits may alias logits.
#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"
#include "ops/cpu/softmax_math.h"

namespace nk::ops::NK_CPU_NS {
namespace {

namespace sm = softmax;

constexpr int64_t kChunk = 2048;  // 8 KiB of fp32: stays in L1 between the max and sum passes

// The chunk [j0, j0+n) of row x as fp32: a pointer into x itself for f32 storage.
inline const float* chunk_f32(const float* x, int64_t j0, int64_t, float*) {
  return x + j0;
}
inline const float* chunk_f32(const bf16* x, int64_t j0, int64_t n, float* buf) {
  for (int64_t j = 0; j < n; ++j) buf[j] = bf16_to_f32(x[j0 + j]);
  return buf;
}

// logsumexp of one row of V logits, online over chunks.
template <typename T>
float row_logsumexp(const T* x, int64_t V, float* buf) {
  float m = -INFINITY, s = 0.f;
  for (int64_t j0 = 0; j0 < V; j0 += kChunk) {
    const int64_t n = std::min(kChunk, V - j0);
    const float* c = chunk_f32(x, j0, n, buf);
    const float cm = sm::max_of(c, n);
    if (cm > m) {
      s *= sm::fast_exp(m - cm);
      m = cm;
    }
    s += sm::sum_exp_shifted(c, n, m, nullptr);
  }
  return m + std::log(s);
}

// dlogits row = (softmax - onehot(t)) * g, chunk by chunk; each element is read
// before it is written, so dx may be x.
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

template <typename T>
void row_grad(T* dx, const T* x, int64_t V, float lse, int64_t t, float xt, float g, float* buf) {
  for (int64_t j0 = 0; j0 < V; j0 += kChunk) {
    const int64_t n = std::min(kChunk, V - j0);
    sm::scaled_exp(chunk_f32(x, j0, n, buf), n, lse, g, grad_dst(dx + j0, buf));
    store_chunk(dx + j0, buf, n);
  }
  dx[t] = from_f32<T>((sm::fast_exp(xt - lse) - 1.f) * g);  // x[t] may be overwritten: saved xt
}

template <typename T>
void cross_entropy_impl(float* losses, T* dlogits, const T* logits, const int32_t* targets,
                        int64_t N, int64_t V, int64_t ignore_index, float g) {
  parallel_for(N, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float buf[kChunk];
    for (int64_t r = begin; r < end; ++r) {
      const T* x = logits + r * V;
      const int64_t t = targets[r];
      if (t == ignore_index) {
        losses[r] = 0.f;
        if (dlogits) std::fill(dlogits + r * V, dlogits + (r + 1) * V, from_f32<T>(0.f));
        continue;
      }
      const float xt = to_f32(x[t]);
      const float lse = row_logsumexp(x, V, buf);
      losses[r] = lse - xt;
      if (dlogits) row_grad(dlogits + r * V, x, V, lse, t, xt, g, buf);
    }
  });
}

// dlogits nullptr: the loss alone.
void run(Tensor losses, Tensor* dlogits, const Tensor& logits, const Tensor& targets,
         int64_t ignore_index, float g) {
  const int64_t V = logits.dim(-1), N = logits.numel() / V;
  // Validate every target before any work: a bad id is the user's data, not a bug.
  const int32_t* tg = targets.data<int32_t>();
  for (int64_t r = 0; r < N; ++r)
    if (tg[r] != ignore_index && (tg[r] < 0 || tg[r] >= V))
      fail("cross_entropy: target id {} at row {} is outside the vocabulary [0, {})", tg[r], r, V);
  if (logits.dtype() == DType::F32)
    cross_entropy_impl(losses.data<float>(), dlogits ? dlogits->data<float>() : nullptr,
                       logits.data<float>(), tg, N, V, ignore_index, g);
  else
    cross_entropy_impl(losses.data<float>(), dlogits ? dlogits->data<bf16>() : nullptr,
                       logits.data<bf16>(), tg, N, V, ignore_index, g);
}

}  // namespace

void cross_entropy_forward(Tensor losses, const Tensor& logits, const Tensor& targets,
                           int64_t ignore_index) {
  run(losses, nullptr, logits, targets, ignore_index, 1.f);
}

void cross_entropy_forward_backward(Tensor losses, Tensor dlogits, const Tensor& logits,
                                    const Tensor& targets, int64_t ignore_index, float grad_scale) {
  run(losses, &dlogits, logits, targets, ignore_index, grad_scale);
}

}  // namespace nk::ops::NK_CPU_NS
