// Reference elementwise ops over n contiguous values (F = float or double).
#pragma once
#include <cmath>
#include <cstdint>

#include "ops/dropout_mask.h"

namespace nk::ref {

template <typename F>
void add(F* y, const F* a, const F* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

template <typename F>
void accumulate(F* dst, const F* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

template <typename F>
void scale(F* x, F s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

template <typename F>
double sum_squares(const F* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

template <typename F>
int64_t count_nonfinite(const F* x, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += !std::isfinite(x[i]);
  return c;
}

// y[n, col0 + j] += s * z[n, j]; y [N, M], z [N, m].
template <typename F>
void add_columns(F* y, const F* z, int64_t N, int64_t M, int64_t m, int64_t col0, F s) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < m; ++j) y[n * M + col0 + j] += s * z[n * m + j];
}

// z[n, j] = s * y[n, col0 + j].
template <typename F>
void copy_columns(F* z, const F* y, int64_t N, int64_t M, int64_t m, int64_t col0, F s) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < m; ++j) z[n * m + j] = s * y[n * M + col0 + j];
}

template <typename F>
void dropout(F* y, const F* x, int64_t n, float p, uint64_t seed) {
  for (int64_t i = 0; i < n; ++i) y[i] = ops::dropout_keeps(seed, i, p) ? x[i] / F(1 - p) : F(0);
}

// y[n, col0 + j] *= l[j]; y [N, M], l [m].
template <typename F>
void scale_columns(F* y, const F* l, int64_t N, int64_t M, int64_t m, int64_t col0) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < m; ++j) y[n * M + col0 + j] *= l[j];
}

// y[n, j] *= s[n]; y [N, M], s [N].
template <typename F>
void scale_rows(F* y, const float* s, int64_t N, int64_t M) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < M; ++j) y[n * M + j] *= F(s[n]);
}

// dl[j] += sum_n a[n, col0 + j] * b[n, j]; a [N, M], b [N, m].
template <typename F>
void column_dot(F* dl, const F* a, const F* b, int64_t N, int64_t M, int64_t m, int64_t col0) {
  for (int64_t j = 0; j < m; ++j)
    for (int64_t n = 0; n < N; ++n) dl[j] += a[n * M + col0 + j] * b[n * m + j];
}

}  // namespace nk::ref
