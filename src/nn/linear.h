// Linear layer y = x W^T + b over views into the parameter arenas. With a
// tensor-parallel size of 1 this is also what the column- and row-parallel
// variants reduce to.
#pragma once
#include "ops/ops.h"

namespace nk::nn {

// [.., X] -> [rows, X]: linear layers see activations as 2-d row blocks.
inline Tensor rows(const Tensor& t) {
  return t.view({-1, t.dim(-1)});
}

struct Linear {
  Tensor w, b;    // compute dtype: [out, in], [out] (b may be undefined)
  Tensor dw, db;  // f32 gradients, accumulated; undefined when frozen (not computed)

  // x [.., in] -> y [.., out]
  void forward(Tensor y, const Tensor& x) const { ops::linear_forward(rows(y), rows(x), w, b); }
  // dx [N, in] written (skipped if undefined); dw, db accumulate.
  void backward(Tensor dx, const Tensor& dy, const Tensor& x) const {
    ops::linear_backward(dx.defined() ? rows(dx) : dx, dw, db, rows(dy), rows(x), w);
  }
};

}  // namespace nk::nn
