// LayerNorm (GPT-2) or RMSNorm (Llama) over the last dimension.
#pragma once
#include "ops/ops.h"

namespace nk::nn {

struct Norm {
  bool rms = false;
  float eps = 1e-5f;
  float w_offset = 0.f;  // RMSNorm's scale is w_offset + w (Gemma: 1)
  Tensor w, b;           // compute dtype [C]; b undefined for RMSNorm
  Tensor dw, db;         // f32 [C]; undefined when frozen (not computed)

  // x, y [N, C]; mean (LayerNorm only), rstd f32 [N] saved for backward.
  void forward(Tensor y, Tensor mean, Tensor rstd, const Tensor& x) const {
    if (rms)
      ops::rmsnorm_forward(y, rstd, x, w, eps, w_offset);
    else
      ops::layernorm_forward(y, mean, rstd, x, w, b, eps);
  }
  // dx ACCUMULATES: it is the residual stream's gradient.
  void backward(Tensor dx, const Tensor& dy, const Tensor& x, const Tensor& mean,
                const Tensor& rstd) const {
    if (rms)
      ops::rmsnorm_backward(dx, dw, dy, x, w, rstd, w_offset);
    else
      ops::layernorm_backward(dx, dw, db, dy, x, w, mean, rstd);
  }
};

}  // namespace nk::nn
