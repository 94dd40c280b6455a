// Reference elementwise ops over n contiguous values (F = float or double).
#pragma once
#include <cmath>
#include <cstdint>

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

}  // namespace nk::ref
