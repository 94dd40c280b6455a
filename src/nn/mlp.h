// Feed-forward block: GELU MLP (GPT-2) or SwiGLU with a fused gate|up
// projection (Llama).
#pragma once
#include "nn/linear.h"

namespace nk::nn {

struct MLP {
  Linear up, down;  // up: [F, C] (GELU) or [2F, C] (SwiGLU gate|up); down: [C, F]
  bool swiglu = false;

  struct Saved {
    Tensor h;                                // up projection output [N, F] or [N, 2F]
    Tensor a;                                // activation output [N, F]
    AdapterActs up_adapters, down_adapters;  // the adapters' (undefined without)
  };
  struct Scratch {
    Tensor dh, da;  // shaped like Saved
  };

  void forward(Tensor y, const Saved& s, const Tensor& x) const {
    up.forward(s.h, x, s.up_adapters);
    activation_forward(s);
    down.forward(y, s.a, s.down_adapters);
  }
  // s.a from s.h (also how activation recompute restores s.a).
  void activation_forward(const Saved& s) const {
    if (swiglu)
      ops::swiglu_forward(rows(s.a), rows(s.h));
    else
      ops::gelu_forward(rows(s.a), rows(s.h));
  }
  // dx written.
  void backward(Tensor dx, const Tensor& dy, const Saved& s, const Scratch& g,
                const Tensor& x) const {
    down.backward(g.da, dy, s.a, s.down_adapters);
    if (swiglu)
      ops::swiglu_backward(rows(g.dh), rows(g.da), rows(s.h));
    else
      ops::gelu_backward(rows(g.dh), rows(g.da), rows(s.h));
    up.backward(dx, g.dh, x, s.up_adapters);
  }
};

}  // namespace nk::nn
