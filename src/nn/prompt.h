// P-tuning's virtual tokens (model/peft.h's PromptConfig): the prompt
// P [n, C] that takes the first n positions of every sequence, and its MLP
// prompt encoder:
//   P = W4 relu(W2 relu(W0 E + b0) + b2) + b4,   E [n, C], hidden H,
// or, without an encoder, P = E (a trained prompt, as it is stored).
#pragma once
#include "nn/linear.h"

namespace nk::nn {

struct Prompt {
  Tensor table, dtable;  // compute dtype E [n, C]; f32 gradient
  Linear mlp[3];         // the encoder's layers; mlp[0].w undefined: no encoder

  // The encoder's activations (batch-independent, so one set per workspace).
  struct Saved {
    Tensor h1, a1, h2, a2;  // [n, H]: W0 E + b0, its relu, W2 a1 + b2, its relu
    Tensor out;             // [n, C]: P (undefined without an encoder: P is the table)
    Tensor dp, dh, da;      // backward: f32 dP [n, C], [n, H], [n, H]
    Tensor dp_c;            // compute-dtype dP [n, C] (bf16 only)
    Tensor dtab;            // dE [n, C] in the compute dtype
  };
  bool active() const { return table.defined(); }
  bool has_encoder() const { return mlp[0].w.defined(); }
  int64_t n() const { return table.dim(0); }

  // P: the table, or the encoder's output over it (computed into s).
  Tensor forward(Saved& s) const {
    if (!has_encoder()) return table;
    mlp[0].forward(s.h1, table);
    ops::relu_forward(s.a1, s.h1);
    mlp[1].forward(s.h2, s.a1);
    ops::relu_forward(s.a2, s.h2);
    mlp[2].forward(s.out, s.a2);
    return s.out;
  }
  // s.dp (f32 dP, summed over the batch) -> the table's and encoder's
  // gradients (accumulated). Runs after forward(s) with the same weights.
  void backward(Saved& s) const {
    if (!has_encoder()) {
      ops::accumulate(dtable, s.dp);
      return;
    }
    Tensor dp = s.dp;
    if (s.dp_c.defined()) {  // the products take the compute dtype
      ops::convert(s.dp_c, s.dp);
      dp = s.dp_c;
    }
    mlp[2].backward(s.da, dp, s.a2);
    ops::relu_backward(s.dh, s.da, s.h2);
    mlp[1].backward(s.da, s.dh, s.a1);
    ops::relu_backward(s.dh, s.da, s.h1);
    mlp[0].backward(s.dtab, s.dh, table);
    ops::accumulate(dtable, s.dtab);
  }
  // The workspace for a prompt of n x C, hidden H (0: no encoder).
  static Saved saved_for(int64_t n, int64_t C, int64_t H, DType dt, Device device) {
    Saved s;
    s.dp = Tensor::empty({n, C}, DType::F32, device);
    if (H == 0) return s;
    for (Tensor* t : {&s.h1, &s.a1, &s.h2, &s.a2, &s.dh, &s.da})
      *t = Tensor::empty({n, H}, dt, device);
    s.out = Tensor::empty({n, C}, dt, device);
    s.dtab = Tensor::empty({n, C}, dt, device);
    if (dt != DType::F32) s.dp_c = Tensor::empty({n, C}, dt, device);
    return s;
  }
};

}  // namespace nk::nn
