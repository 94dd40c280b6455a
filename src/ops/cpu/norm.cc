// LayerNorm and RMSNorm kernels (arguments checked by ops/norm.cc): x, y
// T[N,C]; w, b T[C]; mean, rstd f32[N]. Forward and the dx pass run in
// parallel over rows; the dw/db reductions run in parallel over column blocks,
// each summing its rows in order, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"

namespace nk::ops::NK_CPU_NS {
namespace {

constexpr int64_t kColBlock = 64;  // dw/db columns per task, a few cache lines per row

struct Dims {
  int64_t N, C;
};

Dims dims_of(const Tensor& x) {
  return {rows_of(x), x.dim(-1)};
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
                 int64_t N, int64_t C, float w_off = 0.f) {
  parallel_for(N, row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      const T *xr = x + n * C, *dyr = dy + n * C;
      T* dxr = dx + n * C;
      const float m = mean ? mean[n] : 0.f, s = rstd[n];
      float gm = 0, gxm = 0;
#pragma omp simd reduction(+ : gm, gxm)
      for (int64_t c = 0; c < C; ++c) {
        float g = load(dyr[c]) * (w_off + load(w[c]));
        gm += g;
        gxm += g * (load(xr[c]) - m) * s;
      }
      gm = mean ? gm / float(C) : 0.f;
      gxm /= float(C);
      for (int64_t c = 0; c < C; ++c) {
        float xhat = (load(xr[c]) - m) * s;
        float g = load(dyr[c]) * (w_off + load(w[c]));
        dxr[c] = store<T>(load(dxr[c]) + s * (g - gm - xhat * gxm));
      }
    }
  });
}

// dw[c] += sum_n dy xhat, db[c] += sum_n dy, rows in order; a null dw or db is
// not computed.
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
void rmsnorm_fwd(T* y, float* rstd, const T* x, const T* w, int64_t N, int64_t C, float eps,
                 float w_off) {
  parallel_for(N, row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      const T* xr = x + n * C;
      T* yr = y + n * C;
      float ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t c = 0; c < C; ++c) ss += load(xr[c]) * load(xr[c]);
      float s = 1.f / std::sqrt(ss / float(C) + eps);
      for (int64_t c = 0; c < C; ++c) yr[c] = store<T>(load(xr[c]) * s * (w_off + load(w[c])));
      rstd[n] = s;
    }
  });
}

float* grad_or_null(const Tensor& g) {
  return g.defined() ? g.data<float>() : nullptr;
}

}  // namespace

void layernorm_forward(Tensor y, Tensor mean, Tensor rstd, const Tensor& x, const Tensor& w,
                       const Tensor& b, float eps) {
  const Dims d = dims_of(x);
  dispatch_float(x.dtype(), "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    layernorm_fwd(y.data<T>(), mean.data<float>(), rstd.data<float>(), x.data<T>(), w.data<T>(),
                  b.defined() ? b.data<T>() : nullptr, d.N, d.C, eps);
  });
}

void layernorm_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd) {
  const Dims d = dims_of(x);
  dispatch_float(x.dtype(), "layernorm_backward", [&](auto tag) {
    using T = decltype(tag);
    norm_bwd_dx(dx.data<T>(), dy.data<T>(), x.data<T>(), w.data<T>(), mean.data<float>(),
                rstd.data<float>(), d.N, d.C);
    if (dw.defined() || db.defined())
      norm_bwd_params(grad_or_null(dw), grad_or_null(db), dy.data<T>(), x.data<T>(),
                      mean.data<float>(), rstd.data<float>(), d.N, d.C);
  });
}

void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps,
                     float w_offset) {
  const Dims d = dims_of(x);
  dispatch_float(x.dtype(), "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_fwd(y.data<T>(), rstd.data<float>(), x.data<T>(), w.data<T>(), d.N, d.C, eps, w_offset);
  });
}

void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, float w_offset) {
  const Dims d = dims_of(x);
  dispatch_float(x.dtype(), "rmsnorm_backward", [&](auto tag) {
    using T = decltype(tag);
    norm_bwd_dx(dx.data<T>(), dy.data<T>(), x.data<T>(), w.data<T>(), nullptr, rstd.data<float>(),
                d.N, d.C, w_offset);
    if (dw.defined())
      norm_bwd_params(dw.data<float>(), nullptr, dy.data<T>(), x.data<T>(), nullptr,
                      rstd.data<float>(), d.N, d.C);
  });
}

}  // namespace nk::ops::NK_CPU_NS
