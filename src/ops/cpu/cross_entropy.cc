// Softmax cross-entropy kernels (arguments checked by ops/cross_entropy.cc),
// one row per task, on the row passes of cross_entropy_rows.h. The loss pass
// reads each logit once (each chunk's max folded into a running (max, sum of
// exp) pair); forward_backward then makes a second pass writing dlogits
// element by element after reading it, so dlogits may alias logits.
#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "ops/cpu/cross_entropy_rows.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"

namespace nk::ops::NK_CPU_NS {
namespace {

using xent::kChunk;

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
      const auto [m, s] = xent::row_max_sumexp(x, V, buf);
      const float lse = m + std::log(s);
      losses[r] = lse - to_f32(x[t]);
      if (dlogits) xent::row_grad(dlogits + r * V, x, V, lse, t, g, buf);
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
