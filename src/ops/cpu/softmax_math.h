// Row primitives of the online softmax (attention tiles, cross-entropy chunks),
// written so GCC vectorizes them without -ffast-math: fast_exp and
// reductions kept in 16 independent lanes (no reassociation needed).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

#include "ops/cpu/fast_math.h"
#include "ops/cpu/level.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace nk::ops::NK_CPU_NS::softmax {

constexpr int kLanes = 16;

// exp is fast_exp (fast_math.h): about 2 ulp, branch-free. exp(-inf) and
// anything below -87.3 give exp(-87.3) ~ 1e-38, not 0; callers that need an
// exact zero (masked scores) write it themselves.
using NK_CPU_NS::fast_exp;

#ifdef __AVX512F__

// Full-mask forms of intrinsics whose plain versions trip GCC 12's
// -Wuninitialized (they pass _mm512_undefined_ps() as the merge source).
constexpr __mmask16 kAll = 0xFFFF;
inline __m512 vmax(__m512 a, __m512 b) {
  return _mm512_mask_max_ps(a, kAll, a, b);
}
inline __m512 vmin(__m512 a, __m512 b) {
  return _mm512_mask_min_ps(a, kAll, a, b);
}
inline float hmax(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float m = t[0];
  for (int u = 1; u < 16; ++u) m = t[u] > m ? t[u] : m;
  return m;
}
inline float hsum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s = 0;
  for (int u = 0; u < 16; ++u) s += t[u];
  return s;
}

// 16 lanes of exp(x): 2^t = 2^(t - n) * 2^n with n = round(t), the power applied
// by scalef so underflow goes smoothly to 0 (exp(-inf) = 0). NaN propagates.
inline __m512 exp16(__m512 x) {
  __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f));
  t = vmax(_mm512_set1_ps(-150.f), t);  // NaN in t is kept (second operand)
  t = vmin(_mm512_set1_ps(128.f), t);
  const __m512 n =
      _mm512_mask_roundscale_ps(t, kAll, t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147181f));
  __m512 p = _mm512_set1_ps(1.f / 720.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_mask_scalef_ps(p, kAll, p, n);
}

inline __mmask16 tail_mask(int64_t n) {
  return __mmask16((1u << n) - 1);
}  // n < 16

// max of x[0, n); -inf for n == 0.
inline float max_of(const float* x, int64_t n) {
  __m512 a = _mm512_set1_ps(-INFINITY), b = a;
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    a = vmax(a, _mm512_loadu_ps(x + j));
    b = vmax(b, _mm512_loadu_ps(x + j + 16));
  }
  for (; j < n; j += 16) {
    const __mmask16 k = n - j >= 16 ? __mmask16(0xFFFF) : tail_mask(n - j);
    a = _mm512_mask_max_ps(a, k, a, _mm512_maskz_loadu_ps(k, x + j));
  }
  return hmax(vmax(a, b));
}

// sum_j exp(x[j] - m) over [0, n); if out is non-null it receives the terms.
inline float sum_exp_shifted(const float* x, int64_t n, float m, float* out) {
  const __m512 vm = _mm512_set1_ps(m);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = n - j >= 16 ? __mmask16(0xFFFF) : tail_mask(n - j);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), vm));
    if (out) _mm512_mask_storeu_ps(out + j, k, e);
    acc = _mm512_mask_add_ps(acc, k, acc, e);
  }
  return hsum(acc);
}

// out[j] = exp(x[j] - m) * g over [0, n); out may alias x.
inline void scaled_exp(const float* x, int64_t n, float m, float g, float* out) {
  const __m512 vm = _mm512_set1_ps(m), vg = _mm512_set1_ps(g);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = n - j >= 16 ? __mmask16(0xFFFF) : tail_mask(n - j);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), vm));
    _mm512_mask_storeu_ps(out + j, k, _mm512_mul_ps(e, vg));
  }
}

#else  // portable: reductions in kLanes independent lanes so GCC may vectorize

inline float max_of(const float* x, int64_t n) {
  float acc[kLanes];
  for (int u = 0; u < kLanes; ++u) acc[u] = -INFINITY;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int u = 0; u < kLanes; ++u) acc[u] = x[j + u] > acc[u] ? x[j + u] : acc[u];
  for (; j < n; ++j) acc[0] = x[j] > acc[0] ? x[j] : acc[0];
  float m = acc[0];
  for (int u = 1; u < kLanes; ++u) m = acc[u] > m ? acc[u] : m;
  return m;
}

inline float sum_exp_shifted(const float* x, int64_t n, float m, float* out) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int u = 0; u < kLanes; ++u) {
      const float e = fast_exp(x[j + u] - m);
      if (out) out[j + u] = e;
      acc[u] += e;
    }
  for (; j < n; ++j) {
    const float e = fast_exp(x[j] - m);
    if (out) out[j] = e;
    acc[0] += e;
  }
  float s = 0;
  for (int u = 0; u < kLanes; ++u) s += acc[u];
  return s;
}

inline void scaled_exp(const float* x, int64_t n, float m, float g, float* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = fast_exp(x[j] - m) * g;
}

#endif

}  // namespace nk::ops::NK_CPU_NS::softmax
