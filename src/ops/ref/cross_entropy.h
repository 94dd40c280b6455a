// Reference softmax cross-entropy over the vocabulary, for the tests (F = float
// or double). logits[N,V]; targets[N]; losses[N]; dlogits[N,V].
#pragma once
#include <cmath>
#include <cstdint>

namespace nk::ref {

// Per row: loss = logsumexp(logits) - logits[target]; 0 where target == ignore.
// If dlogits is non-null it receives (softmax - onehot) * grad_scale (zero rows
// for ignored targets). dlogits must not alias logits here.
template <typename F>
void cross_entropy(F* losses, F* dlogits, const F* logits, const int32_t* targets, int64_t n,
                   int64_t v, int64_t ignore_index, F grad_scale) {
  for (int64_t r = 0; r < n; ++r) {
    const F* x = logits + r * v;
    const int64_t t = targets[r];
    if (t == ignore_index) {
      losses[r] = 0;
      if (dlogits)
        for (int64_t j = 0; j < v; ++j) dlogits[r * v + j] = 0;
      continue;
    }
    F m = -INFINITY;
    for (int64_t j = 0; j < v; ++j) m = std::max(m, x[j]);
    F sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(x[j] - m);
    const F lse = m + std::log(sum);
    losses[r] = lse - x[t];
    if (dlogits)
      for (int64_t j = 0; j < v; ++j)
        dlogits[r * v + j] = (std::exp(x[j] - lse) - F(j == t ? 1 : 0)) * grad_scale;
  }
}

}  // namespace nk::ref
