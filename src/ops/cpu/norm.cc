// LayerNorm and RMSNorm over the last dimension: x, y T[N,C]; w, b T[C];
// mean, rstd f32[N]. Forward and the dx pass run in parallel over rows; the
// dw/db reductions run in parallel over column blocks, each summing its rows in
// order, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/ops.h"

namespace nk::ops {
namespace {

using cpu::check_cpu;
using cpu::dispatch_float;
using cpu::load;
using cpu::store;

constexpr int64_t kColBlock = 64;  // dw/db columns per task, a few cache lines per row

struct Dims {
  int64_t N, C;
};

// Shapes and dtypes shared by both norms; returns N and C of x.
Dims check_norm_args(const char* op, const Tensor& x, const Tensor& w, const Tensor& y,
                     const Tensor& rstd) {
  check_cpu(x, op, "x");
  check_cpu(w, op, "w");
  check_cpu(y, op, "y/dy");
  check_cpu(rstd, op, "rstd");
  NK_CHECK(x.ndim() >= 1, "{}: x is a scalar", op);
  Dims d{cpu::rows_of(x), x.dim(-1)};
  check_shape(y, x.shape(), "y/dy");
  check_shape(w, {d.C}, "w");
  check_shape(rstd, {d.N}, "rstd");
  check_dtype(rstd, DType::F32, "rstd");
  NK_CHECK(y.dtype() == x.dtype() && w.dtype() == x.dtype(), "{}: dtypes differ: x {}, y {}, w {}",
           op, x.desc(), y.desc(), w.desc());
  return d;
}

int64_t row_grain(int64_t C) {
  return std::max<int64_t>(1, 8192 / std::max<int64_t>(C, 1));
}

template <typename T>
void layernorm_fwd(T* y, float* mean, float* rstd, const T* x, const T* w, const T* b, int64_t N,
                   int64_t C, float eps) {
  parallel_for(N, row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      const T* xr = x + n * C;
      T* yr = y + n * C;
      float m = 0, v = 0;
#pragma omp simd reduction(+ : m)
      for (int64_t c = 0; c < C; ++c) m += load(xr[c]);
      m /= float(C);
#pragma omp simd reduction(+ : v)
      for (int64_t c = 0; c < C; ++c) {
        float d = load(xr[c]) - m;
        v += d * d;
      }
      float s = 1.f / std::sqrt(v / float(C) + eps);
      if (b) {
        for (int64_t c = 0; c < C; ++c)
          yr[c] = store<T>((load(xr[c]) - m) * s * load(w[c]) + load(b[c]));
      } else {
        for (int64_t c = 0; c < C; ++c) yr[c] = store<T>((load(xr[c]) - m) * s * load(w[c]));
      }
      mean[n] = m;
      rstd[n] = s;
    }
  });
}

// dx += rstd (g - mean(g) - xhat mean(g xhat)), g = dy w. mean == nullptr: RMSNorm
// (no centring, no mean(g) term).
template <typename T>
void norm_bwd_dx(T* dx, const T* dy, const T* x, const T* w, const float* mean, const float* rstd,
                 int64_t N, int64_t C) {
  parallel_for(N, row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      const T *xr = x + n * C, *dyr = dy + n * C;
      T* dxr = dx + n * C;
      const float m = mean ? mean[n] : 0.f, s = rstd[n];
      float gm = 0, gxm = 0;
#pragma omp simd reduction(+ : gm, gxm)
      for (int64_t c = 0; c < C; ++c) {
        float g = load(dyr[c]) * load(w[c]);
        gm += g;
        gxm += g * (load(xr[c]) - m) * s;
      }
      gm = mean ? gm / float(C) : 0.f;
      gxm /= float(C);
      for (int64_t c = 0; c < C; ++c) {
        float xhat = (load(xr[c]) - m) * s;
        float g = load(dyr[c]) * load(w[c]);
        dxr[c] = store<T>(load(dxr[c]) + s * (g - gm - xhat * gxm));
      }
    }
  });
}

// dw[c] += sum_n dy xhat, db[c] += sum_n dy (either may be nullptr), rows in order.
template <typename T>
void norm_bwd_params(float* dw, float* db, const T* dy, const T* x, const float* mean,
                     const float* rstd, int64_t N, int64_t C) {
  const int64_t nblocks = (C + kColBlock - 1) / kColBlock;
  parallel_for(nblocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t c0 = blk * kColBlock, wdt = std::min(kColBlock, C - c0);
      float aw[kColBlock] = {}, ab[kColBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const T *xr = x + n * C + c0, *dyr = dy + n * C + c0;
        const float m = mean ? mean[n] : 0.f, s = rstd[n];
        for (int64_t j = 0; j < wdt; ++j) {
          float d = load(dyr[j]);
          aw[j] += d * (load(xr[j]) - m) * s;
          ab[j] += d;
        }
      }
      if (dw)
        for (int64_t j = 0; j < wdt; ++j) dw[c0 + j] += aw[j];
      if (db)
        for (int64_t j = 0; j < wdt; ++j) db[c0 + j] += ab[j];
    }
  });
}

template <typename T>
void rmsnorm_fwd(T* y, float* rstd, const T* x, const T* w, int64_t N, int64_t C, float eps) {
  parallel_for(N, row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      const T* xr = x + n * C;
      T* yr = y + n * C;
      float ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t c = 0; c < C; ++c) ss += load(xr[c]) * load(xr[c]);
      float s = 1.f / std::sqrt(ss / float(C) + eps);
      for (int64_t c = 0; c < C; ++c) yr[c] = store<T>(load(xr[c]) * s * load(w[c]));
      rstd[n] = s;
    }
  });
}

void check_param_grad(const Tensor& g, int64_t C, const char* name) {
  check_cpu(g, "norm backward", name);
  check_shape(g, {C}, name);
  check_dtype(g, DType::F32, name);
}

}  // namespace

void layernorm_forward(Tensor y, Tensor mean, Tensor rstd, const Tensor& x, const Tensor& w,
                       const Tensor& b, float eps) {
  Dims d = check_norm_args("layernorm_forward", x, w, y, rstd);
  check_cpu(mean, "layernorm_forward", "mean");
  check_shape(mean, {d.N}, "mean");
  check_dtype(mean, DType::F32, "mean");
  if (b.defined()) {
    check_cpu(b, "layernorm_forward", "b");
    check_shape(b, {d.C}, "b");
    check_dtype(b, x.dtype(), "b");
  }
  dispatch_float(x.dtype(), "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    layernorm_fwd(y.data<T>(), mean.data<float>(), rstd.data<float>(), x.data<T>(), w.data<T>(),
                  b.defined() ? b.data<T>() : nullptr, d.N, d.C, eps);
  });
}

void layernorm_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd) {
  Dims d = check_norm_args("layernorm_backward", x, w, dy, rstd);
  check_cpu(dx, "layernorm_backward", "dx");
  check_shape(dx, x.shape(), "dx");
  check_dtype(dx, x.dtype(), "dx");
  check_cpu(mean, "layernorm_backward", "mean");
  check_shape(mean, {d.N}, "mean");
  check_dtype(mean, DType::F32, "mean");
  if (dw.defined()) check_param_grad(dw, d.C, "dw");
  if (db.defined()) check_param_grad(db, d.C, "db");
  dispatch_float(x.dtype(), "layernorm_backward", [&](auto tag) {
    using T = decltype(tag);
    norm_bwd_dx(dx.data<T>(), dy.data<T>(), x.data<T>(), w.data<T>(), mean.data<float>(),
                rstd.data<float>(), d.N, d.C);
    if (dw.defined() || db.defined())
      norm_bwd_params(dw.defined() ? dw.data<float>() : nullptr,
                      db.defined() ? db.data<float>() : nullptr, dy.data<T>(), x.data<T>(),
                      mean.data<float>(), rstd.data<float>(), d.N, d.C);
  });
}

void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) {
  Dims d = check_norm_args("rmsnorm_forward", x, w, y, rstd);
  dispatch_float(x.dtype(), "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_fwd(y.data<T>(), rstd.data<float>(), x.data<T>(), w.data<T>(), d.N, d.C, eps);
  });
}

void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd) {
  Dims d = check_norm_args("rmsnorm_backward", x, w, dy, rstd);
  check_cpu(dx, "rmsnorm_backward", "dx");
  check_shape(dx, x.shape(), "dx");
  check_dtype(dx, x.dtype(), "dx");
  if (dw.defined()) check_param_grad(dw, d.C, "dw");
  dispatch_float(x.dtype(), "rmsnorm_backward", [&](auto tag) {
    using T = decltype(tag);
    norm_bwd_dx(dx.data<T>(), dy.data<T>(), x.data<T>(), w.data<T>(), nullptr, rstd.data<float>(),
                d.N, d.C);
    if (dw.defined())
      norm_bwd_params(dw.data<float>(), nullptr, dy.data<T>(), x.data<T>(), nullptr,
                      rstd.data<float>(), d.N, d.C);
  });
}

}  // namespace nk::ops
