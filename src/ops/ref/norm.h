// Reference LayerNorm and RMSNorm over rows: x, y, dx, dy F[N,C]; w, b, dw, db
// F[C]; mean, rstd F[N]. b/db may be nullptr. dx, dw, db accumulate (+=).
#pragma once
#include <cmath>
#include <cstdint>

namespace nk::ref {

// y = (x - mean) * rstd * w + b with rstd = 1/sqrt(biased var + eps).
template <typename F>
void layernorm_forward(F* y, F* mean, F* rstd, const F* x, const F* w, const F* b, int64_t N,
                       int64_t C, F eps) {
  for (int64_t n = 0; n < N; ++n) {
    const F* xr = x + n * C;
    F m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += xr[c];
    m /= F(C);
    for (int64_t c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    v /= F(C);
    F s = F(1) / std::sqrt(v + eps);
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = (xr[c] - m) * s * w[c] + (b ? b[c] : F(0));
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename F>
void layernorm_backward(F* dx, F* dw, F* db, const F* dy, const F* x, const F* w, const F* mean,
                        const F* rstd, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    const F *xr = x + n * C, *dyr = dy + n * C;
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w.
    F gm = 0, gxm = 0;
    for (int64_t c = 0; c < C; ++c) {
      F xhat = (xr[c] - mean[n]) * rstd[n];
      gm += dyr[c] * w[c];
      gxm += dyr[c] * w[c] * xhat;
    }
    gm /= F(C);
    gxm /= F(C);
    for (int64_t c = 0; c < C; ++c) {
      F xhat = (xr[c] - mean[n]) * rstd[n];
      dx[n * C + c] += rstd[n] * (dyr[c] * w[c] - gm - xhat * gxm);
      dw[c] += dyr[c] * xhat;
      if (db) db[c] += dyr[c];
    }
  }
}

// y = x * rstd * (off + w) with rstd = 1/sqrt(mean(x^2) + eps) (off 1: Gemma's 1 + w).
template <typename F>
void rmsnorm_forward(F* y, F* rstd, const F* x, const F* w, int64_t N, int64_t C, F eps,
                     F off = 0) {
  for (int64_t n = 0; n < N; ++n) {
    const F* xr = x + n * C;
    F ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    F s = F(1) / std::sqrt(ss / F(C) + eps);
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = xr[c] * s * (off + w[c]);
    rstd[n] = s;
  }
}

template <typename F>
void rmsnorm_backward(F* dx, F* dw, const F* dy, const F* x, const F* w, const F* rstd, int64_t N,
                      int64_t C, F off = 0) {
  for (int64_t n = 0; n < N; ++n) {
    const F *xr = x + n * C, *dyr = dy + n * C;
    // dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * (off + w).
    F gxm = 0;
    for (int64_t c = 0; c < C; ++c) gxm += dyr[c] * (off + w[c]) * xr[c] * rstd[n];
    gxm /= F(C);
    for (int64_t c = 0; c < C; ++c) {
      F xhat = xr[c] * rstd[n];
      dx[n * C + c] += rstd[n] * (dyr[c] * (off + w[c]) - xhat * gxm);
      dw[c] += dyr[c] * xhat;
    }
  }
}

}  // namespace nk::ref
