// Vocabulary-parallel cross-entropy kernels (arguments checked by
// ops/cross_entropy_shard.cc), one row per task, on the whole-vocabulary
// kernels' row passes (cross_entropy_rows.h): a shard's row (V / tp logits,
// 25k for GPT-2 at tp 2) is as long as a whole row of a small vocabulary.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/parallel.h"
#include "ops/cpu/cross_entropy_rows.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"

namespace nk::ops::NK_CPU_NS {
namespace {

template <typename T>
void shard_stats(float* mx, float* se, float* tl, const T* x, const int32_t* tg, int64_t n,
                 int64_t vs, int64_t v0) {
  parallel_for(n, 1, [&](int64_t r0, int64_t r1) {
    alignas(64) float buf[xent::kChunk];
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = x + r * vs;
      const int64_t t = int64_t(tg[r]) - v0;
      std::tie(mx[r], se[r]) = xent::row_max_sumexp(row, vs, buf);
      tl[r] = t >= 0 && t < vs ? to_f32(row[t]) : 0.f;
    }
  });
}

template <typename T>
void shard_backward(T* dx, const T* x, const int32_t* tg, const float* lse, int64_t n, int64_t vs,
                    int64_t v0, int64_t ignore, float g) {
  parallel_for(n, 1, [&](int64_t r0, int64_t r1) {
    alignas(64) float buf[xent::kChunk];
    for (int64_t r = r0; r < r1; ++r) {
      if (tg[r] == ignore)
        std::fill(dx + r * vs, dx + (r + 1) * vs, from_f32<T>(0.f));
      else
        xent::row_grad(dx + r * vs, x + r * vs, vs, lse[r], int64_t(tg[r]) - v0, g, buf);
    }
  });
}

}  // namespace

void cross_entropy_shard_stats(Tensor row_max, Tensor sumexp, Tensor target_logit,
                               const Tensor& logits, const Tensor& targets, int64_t vocab_start) {
  const int64_t n = logits.dim(0), vs = logits.dim(1);
  float *mx = row_max.data<float>(), *se = sumexp.data<float>(), *tl = target_logit.data<float>();
  const int32_t* tg = targets.data<int32_t>();
  if (logits.dtype() == DType::F32)
    shard_stats(mx, se, tl, logits.data<float>(), tg, n, vs, vocab_start);
  else
    shard_stats(mx, se, tl, logits.data<bf16>(), tg, n, vs, vocab_start);
}

void cross_entropy_rescale_stats(Tensor row_max, Tensor sumexp, const Tensor& global_max) {
  float *mx = row_max.data<float>(), *se = sumexp.data<float>();
  const float* gm = global_max.data<float>();
  for (int64_t r = 0; r < row_max.numel(); ++r) {
    se[r] *= std::exp(mx[r] - gm[r]);
    mx[r] = gm[r];
  }
}

void cross_entropy_shard_finish(Tensor losses, Tensor lse, const Tensor& row_max,
                                const Tensor& sumexp, const Tensor& target_logit,
                                const Tensor& targets, int64_t ignore_index) {
  float *l = losses.data<float>(), *z = lse.data<float>();
  const float *mx = row_max.data<float>(), *se = sumexp.data<float>(),
              *tl = target_logit.data<float>();
  const int32_t* tg = targets.data<int32_t>();
  for (int64_t r = 0; r < targets.numel(); ++r) {
    const bool skip = tg[r] == ignore_index;
    z[r] = skip ? 0.f : mx[r] + std::log(se[r]);
    l[r] = skip ? 0.f : z[r] - tl[r];
  }
}

void cross_entropy_shard_backward(Tensor dlogits, const Tensor& logits, const Tensor& targets,
                                  const Tensor& lse, int64_t vocab_start, int64_t ignore_index,
                                  float grad_scale) {
  const int64_t n = logits.dim(0), vs = logits.dim(1);
  const int32_t* tg = targets.data<int32_t>();
  const float* z = lse.data<float>();
  if (logits.dtype() == DType::F32)
    shard_backward(dlogits.data<float>(), logits.data<float>(), tg, z, n, vs, vocab_start,
                   ignore_index, grad_scale);
  else
    shard_backward(dlogits.data<bf16>(), logits.data<bf16>(), tg, z, n, vs, vocab_start,
                   ignore_index, grad_scale);
}

}  // namespace nk::ops::NK_CPU_NS
