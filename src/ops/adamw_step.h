// What the AdamW kernels of every backend share (host code): the per-step
// constants, computed once in double as the CPU always has, and the choice
// of adamw_step_mixed's instantiation (moment dtype, master kind, copy dtype)
// from the tensors. Each backend supplies its own step: a functor with
//   template <typename M, MasterKind K, typename C>
//   void run(const MixedBuffers& b, M* m, M* v, C* copy) const;
#pragma once
#include <cmath>
#include <cstdint>

#include "core/tensor.h"
#include "ops/dtype_dispatch.h"
#include "ops/ops.h"

namespace nk::ops {

struct AdamConsts {
  float lr, b1, b2, eps, decay, rbc1, rbc2_sqrt, gs;
};

// Bias corrections in double: 1 - b2^t is tiny early and needs the digits.
inline AdamConsts adam_consts(const AdamWParams& p) {
  const double bc1 = 1.0 - std::pow(double(p.beta1), double(p.step));
  const double bc2 = 1.0 - std::pow(double(p.beta2), double(p.step));
  return {p.lr,
          p.beta1,
          p.beta2,
          p.eps,
          float(1.0 - double(p.lr) * double(p.weight_decay)),
          float(1.0 / bc1),
          float(1.0 / std::sqrt(bc2)),
          p.grad_scale};
}

enum class MasterKind { F32, Bf16Remainder, Bf16Plain };

struct MixedBuffers {
  float* master32 = nullptr;      // MasterKind::F32
  uint16_t* master16 = nullptr;   // bf16 bits, the other kinds
  uint16_t* remainder = nullptr;  // Bf16Remainder
  const float* g = nullptr;
};

// adamw_step_mixed's arguments (ops.h) to one call of step.run<M, K, C>.
template <typename Step>
void dispatch_adamw_mixed(const Tensor& master, const Tensor& remainder, const Tensor& grad,
                          const Tensor& m, const Tensor& v, const Tensor& param_copy,
                          const Step& step) {
  MixedBuffers b;
  b.g = grad.data<float>();
  MasterKind kind = MasterKind::F32;
  if (master.dtype() == DType::F32) {
    b.master32 = master.data<float>();
  } else {
    b.master16 = static_cast<uint16_t*>(master.raw());
    kind = remainder.defined() ? MasterKind::Bf16Remainder : MasterKind::Bf16Plain;
    if (remainder.defined()) b.remainder = static_cast<uint16_t*>(remainder.raw());
  }
  dispatch_float(m.dtype(), "adamw_step_mixed", [&](auto mtag) {
    using M = decltype(mtag);
    M *pm = m.data<M>(), *pv = v.data<M>();
    switch (kind) {
      case MasterKind::F32:
        if (!param_copy.defined()) {
          step.template run<M, MasterKind::F32, float>(b, pm, pv, nullptr);
          return;
        }
        dispatch_float(param_copy.dtype(), "adamw_step_mixed", [&](auto ctag) {
          using C = decltype(ctag);
          step.template run<M, MasterKind::F32, C>(b, pm, pv, param_copy.data<C>());
        });
        return;
      case MasterKind::Bf16Remainder:
        step.template run<M, MasterKind::Bf16Remainder, float>(b, pm, pv, nullptr);
        return;
      case MasterKind::Bf16Plain:
        step.template run<M, MasterKind::Bf16Plain, float>(b, pm, pv, nullptr);
        return;
    }
  });
}

}  // namespace nk::ops
