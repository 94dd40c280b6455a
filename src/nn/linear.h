// Linear layer y = x W^T + b over views into the parameter arenas, with
// optional adapters (LoRA, IA3, bottleneck: nn/adapters.h). With a tensor-parallel
// size of 1 this is also what the column- and row-parallel variants reduce to.
#pragma once
#include <vector>

#include "nn/adapters.h"
#include "ops/ops.h"
#include "ops/quant.h"

namespace nk::nn {

// [.., X] -> [rows, X]: linear layers see activations as 2-d row blocks.
inline Tensor rows(const Tensor& t) {
  return t.view({-1, t.dim(-1)});
}

struct Linear {
  Tensor w, b;            // compute dtype: [out, in], [out] (b may be undefined)
  Tensor dw, db;          // f32 gradients, accumulated; undefined when frozen (not computed)
  Lora lora;              // adapters on the output; inactive when it has no parts
  Ia3 ia3;                // learned scales of the output or input; inactive without
  Bottleneck bottleneck;  // an adapter after the whole output; inactive without
  // A row-parallel layer under tensor parallelism: its output is a partial
  // sum, so the bottleneck adapter runs after the group's sum, in the block
  // (bottleneck_after_sum_forward / _backward), not in forward / backward.
  bool bottleneck_after_sum = false;
  // A frozen weight stored as NF4 (QLoRA's base) instead of w: the products
  // dequantise it panel by panel (ops.h). w, dw and db are then undefined.
  ops::Nf4Weight wq;
  // A frozen weight in ggml's block formats or int8 (inference only): its
  // rows as runs, each one type (usually one run). w, dw, db undefined.
  std::vector<ops::QuantWeight> wquant;

  // x [.., in] -> y [.., out]. ad: the adapters' activations and scratch
  // (needed when any adapter is active).
  void forward(Tensor y, const Tensor& x, const AdapterActs& ad = {}) const {
    check_adapters(ad);
    Tensor y2 = rows(y), x2 = rows(x);
    // Adapters switched off (AdapterScratch::off): exactly the base layer.
    const bool on = !ad.defined() || !ad.work->off;
    if (wq.defined())
      ops::nf4_linear_forward(y2, x2, wq, b);
    else if (!wquant.empty())
      ops::quant_linear_forward_runs(y2, x2, wquant, b);
    else
      ops::linear_forward(y2, on && ia3.active() ? ia3.input(x2, ad) : x2, w, b);
    if (!on) return;
    if (ia3.active()) ia3.scale_output(y2);
    if (lora.active()) lora.forward(y2, x2, ad);
    if (bottleneck.active() && !bottleneck_after_sum) bottleneck.forward(y2, ad);
  }
  // bottleneck_after_sum: the adapter over the summed output y (this rank's
  // rows under sequence parallelism), in place; nothing otherwise.
  void bottleneck_after_sum_forward(const Tensor& y, const AdapterActs& ad) const {
    if (bottleneck_after_sum && (!ad.defined() || !ad.work->off)) bottleneck.forward(rows(y), ad);
  }
  // Its backward: the gradient of the sum from dy (in the adapters' scratch;
  // dy itself otherwise), the adapter's gradients accumulated.
  Tensor bottleneck_after_sum_backward(const Tensor& dy, const AdapterActs& ad) const {
    if (!bottleneck_after_sum) return dy;
    return bottleneck.output_grad(rows(dy), ad).view(dy.shape());
  }
  // dx [N, in] written (skipped if undefined); dw, db accumulate. IA3
  // trains its scales with W frozen (dw, db undefined).
  void backward(Tensor dx, const Tensor& dy, const Tensor& x, const AdapterActs& ad = {}) const {
    check_adapters(ad);
    NK_CHECK(!ad.defined() || !ad.work->off, "Linear: a backward with the adapters switched off");
    Tensor dx2 = dx.defined() ? rows(dx) : dx, dy2 = rows(dy), x2 = rows(x);
    NK_CHECK(wquant.empty(), "Linear: a block-quantised weight has no backward (inference only)");
    if (wq.defined()) {
      NK_CHECK(!dw.defined() && !db.defined(), "Linear: an NF4 weight is frozen");
      if (dx2.defined()) ops::nf4_linear_backward_input(dx2, dy2, wq);
    } else if (bottleneck.active()) {
      NK_CHECK(!dw.defined() && !db.defined(),
               "Linear: a bottleneck adapter over a trainable weight");
      ops::linear_backward(dx2, Tensor(), Tensor(),
                           bottleneck_after_sum ? dy2 : bottleneck.output_grad(dy2, ad), x2, w);
    } else if (ia3.active()) {
      NK_CHECK(!dw.defined() && !db.defined(), "Linear: IA3 scales over a trainable weight");
      Tensor dyb = ia3.output_grad(dy2, x2, w, b, ad);
      // The input scale's gradient needs d(x * l) even where dx is not wanted.
      Tensor dxs = dx2.defined() || !ia3.in.defined()
                       ? dx2
                       : ad.work->dx.narrow0(0, x2.numel()).view(x2.shape());
      ops::linear_backward(dxs, Tensor(), Tensor(), dyb, x2, w);  // W is frozen: x unused
      if (dxs.defined()) ia3.input_grad(dxs, x2);
    } else {
      ops::linear_backward(dx2, dw, db, dy2, x2, w);
    }
    if (lora.active()) lora.backward(dx2, dy2, x2, ad);
  }

 private:
  void check_adapters(const AdapterActs& ad) const {
    NK_CHECK(!(lora.active() || ia3.active() || bottleneck.active()) || ad.defined(),
             "Linear: adapters without their activations");
    NK_CHECK(!((wq.defined() || !wquant.empty()) && (ia3.active() || bottleneck.active())),
             "Linear: IA3 or a bottleneck adapter over a quantised weight");
  }
};

}  // namespace nk::nn
