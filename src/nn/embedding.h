// Token embedding plus, for GPT-2, learned positions.
#pragma once
#include "ops/ops.h"

namespace nk::nn {

struct Embedding {
  Tensor wte, wpe;    // compute dtype [V, C], [maxT, C] (wpe undefined with RoPE)
  Tensor dwte, dwpe;  // f32

  void forward(Tensor out, const Tensor& tokens) const {
    ops::embedding_forward(out, tokens, wte, wpe);
  }
  void backward(const Tensor& dout, const Tensor& tokens) const {
    ops::embedding_backward(dwte, dwpe, dout, tokens);
  }
};

}  // namespace nk::nn
