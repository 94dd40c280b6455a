// Reference AdamW step over n values (PyTorch semantics: decoupled decay,
// bias-corrected moments). step is 1-based.
#pragma once
#include <cmath>
#include <cstdint>

namespace nk::ref {

template <typename F>
void adamw_step(F* p, const F* grad, F* m, F* v, int64_t n, F lr, F beta1, F beta2, F eps, F wd,
                int64_t step, F grad_scale) {
  F bc1 = F(1) - std::pow(beta1, F(step)), bc2 = F(1) - std::pow(beta2, F(step));
  for (int64_t i = 0; i < n; ++i) {
    F g = grad[i] * grad_scale;
    p[i] *= F(1) - lr * wd;
    m[i] = beta1 * m[i] + (F(1) - beta1) * g;
    v[i] = beta2 * v[i] + (F(1) - beta2) * g * g;
    p[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps);
  }
}

}  // namespace nk::ref
