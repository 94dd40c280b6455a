// Reference linear layer: plain triple loops on raw row-major buffers, for the
// tests (F = float or double). Shapes: x[N,in], w[out,in], b[out], y[N,out].
#pragma once
#include <cstdint>

namespace nk::ref {

// y = x @ w^T + b (b may be null).
template <typename F>
void linear_forward(F* y, const F* x, const F* w, const F* b, int64_t n, int64_t in, int64_t out) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      F acc = b ? b[o] : F(0);
      for (int64_t k = 0; k < in; ++k) acc += x[i * in + k] * w[o * in + k];
      y[i * out + o] = acc;
    }
}

// dx = dy @ w (written; skipped if null); dw += dy^T @ x; db += sum_n dy
// (skipped if null). dy[N,out].
template <typename F>
void linear_backward(F* dx, F* dw, F* db, const F* dy, const F* x, const F* w, int64_t n,
                     int64_t in, int64_t out) {
  if (dx)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < in; ++k) {
        F acc = 0;
        for (int64_t o = 0; o < out; ++o) acc += dy[i * out + o] * w[o * in + k];
        dx[i * in + k] = acc;
      }
  for (int64_t o = 0; o < out; ++o)
    for (int64_t k = 0; k < in; ++k) {
      F acc = 0;
      for (int64_t i = 0; i < n; ++i) acc += dy[i * out + o] * x[i * in + k];
      dw[o * in + k] += acc;
    }
  if (db)
    for (int64_t o = 0; o < out; ++o) {
      F acc = 0;
      for (int64_t i = 0; i < n; ++i) acc += dy[i * out + o];
      db[o] += acc;
    }
}

}  // namespace nk::ref
