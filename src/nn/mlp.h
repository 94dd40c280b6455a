// Feed-forward block: GELU MLP (GPT-2) or SwiGLU with a fused gate|up
// projection (Llama), or GeGLU (the gate through the tanh GELU: Gemma). Tensor parallel
// (nn/tensor_parallel.h): up is column-parallel (this rank's share of the gate units and of the up
// units), down row-parallel; under sequence parallelism x, y and dx are this rank's rows [N/t, C].
#pragma once
#include "nn/linear.h"
#include "nn/tensor_parallel.h"

namespace nk::nn {

struct MLP {
  Linear up, down;      // up: [F, C] (GELU) or [2F, C] (SwiGLU gate|up); down: [C, F]
  bool swiglu = false;  // gated
  bool geglu = false;   // with swiglu: the gate's activation is the tanh GELU
  TensorParallel tp;

  struct Saved {
    Tensor h;                                // up projection output [N, F] or [N, 2F]
    Tensor a;                                // activation output [N, F]
    AdapterActs up_adapters, down_adapters;  // the adapters' (undefined without)
    Tensor full_x, full_y;  // sequence parallel: [N, C] scratch shared by every layer
  };
  struct Scratch {
    Tensor dh, da;  // shaped like Saved
  };

  void forward(Tensor y, const Saved& s, const Tensor& x) const { forward_over(tp, y, s, x); }
  // The cached decode's: x, y [N, C] every row on every rank (no sequence
  // parallelism; s.full_x, s.full_y unused).
  void forward_cached(Tensor y, const Saved& s, const Tensor& x) const {
    forward_over(tp.whole_rows(), y, s, x);
  }
  void forward_over(const TensorParallel& t, Tensor y, const Saved& s, const Tensor& x) const {
    up.forward(s.h, t.enter(x, s.full_x), s.up_adapters);
    activation_forward(s);
    down.forward(t.exit_buffer(y, s.full_y), s.a, s.down_adapters);
    t.exit(y, s.full_y);
    down.bottleneck_after_sum_forward(y, s.down_adapters);
  }
  // s.a from s.h (also how activation recompute restores s.a).
  void activation_forward(const Saved& s) const {
    if (swiglu && geglu)
      ops::geglu_forward(rows(s.a), rows(s.h));
    else if (swiglu)
      ops::swiglu_forward(rows(s.a), rows(s.h));
    else
      ops::gelu_forward(rows(s.a), rows(s.h));
  }
  // dx written.
  void backward(Tensor dx, const Tensor& dy, const Saved& s, const Scratch& g,
                const Tensor& x) const {
    down.backward(
        g.da, tp.exit_backward(down.bottleneck_after_sum_backward(dy, s.down_adapters), s.full_y),
        s.a, s.down_adapters);
    if (swiglu && geglu)
      ops::geglu_backward(rows(g.dh), rows(g.da), rows(s.h));
    else if (swiglu)
      ops::swiglu_backward(rows(g.dh), rows(g.da), rows(s.h));
    else
      ops::gelu_backward(rows(g.dh), rows(g.da), rows(s.h));
    up.backward(tp.enter_grad(dx, s.full_y), g.dh, tp.enter(x, s.full_x), s.up_adapters);
    tp.enter_backward(dx, s.full_y);
  }
};

}  // namespace nk::nn
