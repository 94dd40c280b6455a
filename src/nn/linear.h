// Linear layer y = x W^T + b over views into the parameter arenas, with
// optional LoRA adapters on its output (nn/lora.h). With a tensor-parallel
// size of 1 this is also what the column- and row-parallel variants reduce to.
#pragma once
#include "nn/lora.h"
#include "ops/ops.h"

namespace nk::nn {

// [.., X] -> [rows, X]: linear layers see activations as 2-d row blocks.
inline Tensor rows(const Tensor& t) {
  return t.view({-1, t.dim(-1)});
}

struct Linear {
  Tensor w, b;    // compute dtype: [out, in], [out] (b may be undefined)
  Tensor dw, db;  // f32 gradients, accumulated; undefined when frozen (not computed)
  Lora lora;      // adapters on the output; inactive when it has no parts

  // x [.., in] -> y [.., out]. la: the adapters' saved activations (needed
  // when lora is active).
  void forward(Tensor y, const Tensor& x, const LoraActs& la = {}) const {
    ops::linear_forward(rows(y), rows(x), w, b);
    if (lora.active()) {
      NK_CHECK(la.defined(), "Linear: LoRA adapters without their activations");
      lora.forward(rows(y), rows(x), la);
    }
  }
  // dx [N, in] written (skipped if undefined); dw, db accumulate.
  void backward(Tensor dx, const Tensor& dy, const Tensor& x, const LoraActs& la = {}) const {
    ops::linear_backward(dx.defined() ? rows(dx) : dx, dw, db, rows(dy), rows(x), w);
    if (lora.active()) {
      NK_CHECK(la.defined(), "Linear: LoRA adapters without their activations");
      lora.backward(dx.defined() ? rows(dx) : dx, rows(dy), rows(x), la);
    }
  }
};

}  // namespace nk::nn
