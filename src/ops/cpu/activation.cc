// GELU (tanh form) and SwiGLU, elementwise in fp32 with a vectorizable exp.
// tanh form rewritten: 0.5 (1 + tanh u) = sigmoid(2u), which has no cancellation.
#include "core/parallel.h"
#include "ops/cpu/fast_math.h"
#include "ops/cpu/float_io.h"
#include "ops/ops.h"

namespace nk::ops {
namespace {

using cpu::check_cpu;
using cpu::dispatch_float;
using cpu::fast_sigmoid;
using cpu::load;
using cpu::store;

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

void check_same(const char* op, const Tensor& a, const char* an, const Tensor& b, const char* bn) {
  check_cpu(a, op, an);
  check_cpu(b, op, bn);
  NK_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype(), "{}: {} {} vs {} {}", op, an, a.desc(),
           bn, b.desc());
}

// Checks y T[..., F] against gu T[..., 2F]; returns {N, F}.
std::pair<int64_t, int64_t> check_swiglu(const char* op, const Tensor& y, const Tensor& gu) {
  check_cpu(y, op, "y/dy");
  check_cpu(gu, op, "gu");
  NK_CHECK(gu.ndim() >= 1 && gu.dim(-1) % 2 == 0, "{}: gu {} has an odd last dim", op, gu.desc());
  Shape ys = gu.shape();
  ys.back() /= 2;
  check_shape(y, ys, "y/dy");
  check_dtype(y, gu.dtype(), "y/dy");
  return {cpu::rows_of(gu), ys.back()};
}

}  // namespace

void gelu_forward(Tensor y, const Tensor& x) {
  check_same("gelu_forward", y, "y", x, "x");
  dispatch_float(x.dtype(), "gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    gelu_fwd(y.data<T>(), x.data<T>(), x.numel());
  });
}

void gelu_backward(Tensor dx, const Tensor& dy, const Tensor& x) {
  check_same("gelu_backward", dx, "dx", x, "x");
  check_same("gelu_backward", dy, "dy", x, "x");
  dispatch_float(x.dtype(), "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    gelu_bwd(dx.data<T>(), dy.data<T>(), x.data<T>(), x.numel());
  });
}

void swiglu_forward(Tensor y, const Tensor& gu) {
  auto [N, F] = check_swiglu("swiglu_forward", y, gu);
  dispatch_float(gu.dtype(), "swiglu_forward", [&](auto tag) {
    using T = decltype(tag);
    swiglu_fwd(y.data<T>(), gu.data<T>(), N, F);
  });
}

void swiglu_backward(Tensor dgu, const Tensor& dy, const Tensor& gu) {
  auto [N, F] = check_swiglu("swiglu_backward", dy, gu);
  check_same("swiglu_backward", dgu, "dgu", gu, "gu");
  dispatch_float(gu.dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    swiglu_bwd(dgu.data<T>(), dy.data<T>(), gu.data<T>(), N, F);
  });
}

}  // namespace nk::ops
