// GELU (tanh form), SiLU, ReLU, SwiGLU, GeGLU and soft-capping kernels (arguments checked by
// ops/activation.cc), elementwise in fp32 with a vectorizable exp.
// tanh form rewritten: 0.5 (1 + tanh u) = sigmoid(2u), which has no cancellation.
#include <cmath>

#include "core/parallel.h"
#include "ops/cpu/fast_math.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"

namespace nk::ops::NK_CPU_NS {
namespace {

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;
constexpr int64_t kGrain = 1 << 14;

// y[i] = f(x[i]); dx[i] = dy[i] * g(x[i]) (g: f's derivative). In place is
// fine: each element is read before it is written.
template <typename T, typename F>
void unary_fwd(T* y, const T* x, int64_t n, F f) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = store<T>(f(load(x[i])));
  });
}

template <typename T, typename G>
void unary_bwd(T* dx, const T* dy, const T* x, int64_t n, G g) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dx[i] = store<T>(load(dy[i]) * g(load(x[i])));
  });
}

float gelu(float v) {
  float u = kGeluK * (v + kGeluC * v * v * v);
  return v * fast_sigmoid(2.f * u);
}

// d/dx [x s(2u)] = s + x * 2 s (1 - s) u'.
float gelu_grad(float v) {
  float u = kGeluK * (v + kGeluC * v * v * v);
  float du = kGeluK * (1.f + 3.f * kGeluC * v * v);
  float s = fast_sigmoid(2.f * u);
  return s + 2.f * v * s * (1.f - s) * du;
}

float silu(float v) {
  return v * fast_sigmoid(v);
}

// d/dx [x s(x)] = s (1 + x (1 - s)).
float silu_grad(float v) {
  float s = fast_sigmoid(v);
  return s * (1.f + v * (1.f - s));
}

float relu(float v) {
  return v > 0.f ? v : 0.f;
}

float relu_grad(float v) {
  return v > 0.f ? 1.f : 0.f;
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

// GeGLU: y = gelu(g) u over gu T[N, 2F] = [gate | up], the tanh GELU above.
template <typename T>
void geglu_fwd(T* y, const T* gu, int64_t N, int64_t F) {
  parallel_for(N, std::max<int64_t>(1, kGrain / std::max<int64_t>(F, 1)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t n = r0; n < r1; ++n) {
                   const T *g = gu + n * 2 * F, *u = g + F;
                   T* yr = y + n * F;
                   for (int64_t f = 0; f < F; ++f) yr[f] = store<T>(gelu(load(g[f])) * load(u[f]));
                 }
               });
}

// d gate = dy u gelu'(g); d up = dy gelu(g).
template <typename T>
void geglu_bwd(T* dgu, const T* dy, const T* gu, int64_t N, int64_t F) {
  parallel_for(N, std::max<int64_t>(1, kGrain / std::max<int64_t>(F, 1)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t n = r0; n < r1; ++n) {
                   const T *g = gu + n * 2 * F, *u = g + F, *d = dy + n * F;
                   T *dg = dgu + n * 2 * F, *du = dg + F;
                   for (int64_t f = 0; f < F; ++f) {
                     const float gv = load(g[f]), uv = load(u[f]), dv = load(d[f]);
                     const float a = gelu(gv), da = gelu_grad(gv);
                     dg[f] = store<T>(dv * uv * da);
                     du[f] = store<T>(dv * a);
                   }
                 }
               });
}

}  // namespace

#define NK_UNARY_KERNELS(name)                                                         \
  void name##_forward(Tensor y, const Tensor& x) {                                     \
    dispatch_float(x.dtype(), #name "_forward", [&](auto tag) {                        \
      using T = decltype(tag);                                                         \
      unary_fwd(y.data<T>(), x.data<T>(), x.numel(), [](float v) { return name(v); }); \
    });                                                                                \
  }                                                                                    \
  void name##_backward(Tensor dx, const Tensor& dy, const Tensor& x) {                 \
    dispatch_float(x.dtype(), #name "_backward", [&](auto tag) {                       \
      using T = decltype(tag);                                                         \
      unary_bwd(dx.data<T>(), dy.data<T>(), x.data<T>(), x.numel(),                    \
                [](float v) { return name##_grad(v); });                               \
    });                                                                                \
  }
NK_UNARY_KERNELS(gelu)
NK_UNARY_KERNELS(silu)
NK_UNARY_KERNELS(relu)
#undef NK_UNARY_KERNELS

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

void geglu_forward(Tensor y, const Tensor& gu) {
  const int64_t N = rows_of(gu), F = gu.dim(-1) / 2;
  dispatch_float(gu.dtype(), "geglu_forward", [&](auto tag) {
    using T = decltype(tag);
    geglu_fwd(y.data<T>(), gu.data<T>(), N, F);
  });
}

void geglu_backward(Tensor dgu, const Tensor& dy, const Tensor& gu) {
  const int64_t N = rows_of(gu), F = gu.dim(-1) / 2;
  dispatch_float(gu.dtype(), "geglu_backward", [&](auto tag) {
    using T = decltype(tag);
    geglu_bwd(dgu.data<T>(), dy.data<T>(), gu.data<T>(), N, F);
  });
}

// cap tanh(x / cap) in f32 (std::tanh: the logits' tails matter to the loss).
void softcap_forward(Tensor y, const Tensor& x, float cap) {
  dispatch_float(x.dtype(), "softcap_forward", [&](auto tag) {
    using T = decltype(tag);
    unary_fwd(y.data<T>(), x.data<T>(), x.numel(),
              [cap](float v) { return cap * std::tanh(v / cap); });
  });
}

// dx = dy (1 - (y / cap)^2), from the forward's output y.
void softcap_backward(Tensor dx, const Tensor& dy, const Tensor& y, float cap) {
  dispatch_float(y.dtype(), "softcap_backward", [&](auto tag) {
    using T = decltype(tag);
    unary_bwd(dx.data<T>(), dy.data<T>(), y.data<T>(), y.numel(), [cap](float v) {
      const float t = v / cap;
      return 1.f - t * t;
    });
  });
}

}  // namespace nk::ops::NK_CPU_NS
