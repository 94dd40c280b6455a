// Token embedding plus, for GPT-2, learned positions.
#pragma once
#include "ops/ops.h"
#include "ops/quant.h"

namespace nk::nn {

struct Embedding {
  Tensor wte, wpe;       // compute dtype [V, C], [maxT, C] (wpe undefined with RoPE)
  Tensor dwte, dwpe;     // f32; undefined when frozen (not computed)
  ops::Nf4Weight wte_q;  // the frozen table as NF4 (QLoRA) instead of wte
  // The frozen table block-quantised (inference; models without wpe).
  ops::QuantWeight wte_quant;

  // positions i32[B, T] (packed rows) or undefined for 0..T-1 in every row.
  void forward(Tensor out, const Tensor& tokens, const Tensor& positions = Tensor()) const {
    if (wte_q.defined()) {
      ops::nf4_embedding_forward(out, tokens, wte_q, wpe, positions);
    } else if (wte_quant.defined()) {
      NK_CHECK(!wpe.defined(), "Embedding: a block-quantised table with learned positions");
      ops::quant_embedding_forward(out, tokens, wte_quant);
    } else {
      ops::embedding_forward(out, tokens, wte, wpe, positions);
    }
  }
  void backward(const Tensor& dout, const Tensor& tokens,
                const Tensor& positions = Tensor()) const {
    ops::embedding_backward(dwte, dwpe, dout, tokens, positions);
  }
};

}  // namespace nk::nn
