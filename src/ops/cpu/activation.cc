// GELU (tanh form) and SwiGLU kernels (arguments checked by
// ops/activation.cc), elementwise in fp32 with a vectorizable exp.
// tanh form rewritten: 0.5 (1 + tanh u) = sigmoid(2u), which has no cancellation.
#include "core/parallel.h"
#include "ops/cpu/fast_math.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"

namespace nk::ops::cpu {
namespace {

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;
constexpr int64_t kGrain = 1 << 14;

template <typename T>
void gelu_fwd(T* y, const T* x, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float v = load(x[i]);
      float u = kGeluK * (v + kGeluC * v * v * v);
      y[i] = store<T>(v * fast_sigmoid(2.f * u));
    }
  });
}

// d/dx [x s(2u)] = s + x * 2 s (1 - s) u'; dx may alias dy (elementwise).
template <typename T>
void gelu_bwd(T* dx, const T* dy, const T* x, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float v = load(x[i]);
      float u = kGeluK * (v + kGeluC * v * v * v);
      float du = kGeluK * (1.f + 3.f * kGeluC * v * v);
      float s = fast_sigmoid(2.f * u);
      dx[i] = store<T>(load(dy[i]) * (s + 2.f * v * s * (1.f - s) * du));
    }
  });
}

// gu T[N, 2F] = [gate | up]; y T[N, F].
template <typename T>
void swiglu_fwd(T* y, const T* gu, int64_t N, int64_t F) {
  parallel_for(N, std::max<int64_t>(1, kGrain / std::max<int64_t>(F, 1)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t n = r0; n < r1; ++n) {
                   const T *g = gu + n * 2 * F, *u = g + F;
                   T* yr = y + n * F;
                   for (int64_t f = 0; f < F; ++f) {
                     float gv = load(g[f]);
                     yr[f] = store<T>(gv * fast_sigmoid(gv) * load(u[f]));
                   }
                 }
               });
}

template <typename T>
void swiglu_bwd(T* dgu, const T* dy, const T* gu, int64_t N, int64_t F) {
  parallel_for(N, std::max<int64_t>(1, kGrain / std::max<int64_t>(F, 1)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t n = r0; n < r1; ++n) {
                   const T *g = gu + n * 2 * F, *u = g + F, *d = dy + n * F;
                   T *dg = dgu + n * 2 * F, *du = dg + F;
                   for (int64_t f = 0; f < F; ++f) {
                     float gv = load(g[f]), uv = load(u[f]), dv = load(d[f]);
                     float s = fast_sigmoid(gv);
                     float dgv = dv * uv * s * (1.f + gv * (1.f - s));
                     float duv = dv * gv * s;
                     dg[f] = store<T>(dgv);
                     du[f] = store<T>(duv);
                   }
                 }
               });
}

}  // namespace

void gelu_forward(Tensor y, const Tensor& x) {
  dispatch_float(x.dtype(), "gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    gelu_fwd(y.data<T>(), x.data<T>(), x.numel());
  });
}

void gelu_backward(Tensor dx, const Tensor& dy, const Tensor& x) {
  dispatch_float(x.dtype(), "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    gelu_bwd(dx.data<T>(), dy.data<T>(), x.data<T>(), x.numel());
  });
}

void swiglu_forward(Tensor y, const Tensor& gu) {
  const int64_t N = rows_of(gu), F = gu.dim(-1) / 2;
  dispatch_float(gu.dtype(), "swiglu_forward", [&](auto tag) {
    using T = decltype(tag);
    swiglu_fwd(y.data<T>(), gu.data<T>(), N, F);
  });
}

void swiglu_backward(Tensor dgu, const Tensor& dy, const Tensor& gu) {
  const int64_t N = rows_of(gu), F = gu.dim(-1) / 2;
  dispatch_float(gu.dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    swiglu_bwd(dgu.data<T>(), dy.data<T>(), gu.data<T>(), N, F);
  });
}

}  // namespace nk::ops::cpu
