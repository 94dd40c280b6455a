// AdamW kernels (arguments checked by ops/adamw.cc), one pass (PyTorch
// semantics): over flat f32 buffers, optionally writing the new params in the
// compute dtype at the same time; and adamw_step_mixed, the same step with
// its state in bf16/f16 and a bf16 master with its remainder.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <type_traits>

#include "core/parallel.h"
#include "ops/adamw_step.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"
#include "ops/ops.h"

namespace nk::ops::NK_CPU_NS {
namespace {

[[maybe_unused]] float adamw_one(float* p, const float* g, float* m, float* v, int64_t i,
                                 const AdamConsts& k) {
  float gi = g[i] * k.gs;
  float mi = k.b1 * m[i] + (1.f - k.b1) * gi;
  float vi = k.b2 * v[i] + (1.f - k.b2) * gi * gi;
  // mhat / (sqrt(vhat) + eps) with mhat = m rbc1, sqrt(vhat) = sqrt(v) rbc2_sqrt.
  float pi = p[i] * k.decay - k.lr * (mi * k.rbc1) / (std::sqrt(vi) * k.rbc2_sqrt + k.eps);
  m[i] = mi;
  v[i] = vi;
  p[i] = pi;
  return pi;
}

// Elements [b, e). GCC will not vectorize sqrtf without -fno-math-errno, so the
// AVX-512 and AVX2 paths spell the update out, the same operations in the same
// order (the levels agree bit for bit); the tail is masked so every element
// takes the same instructions whatever the chunking (bit-identical for any
// thread count).
void adamw_range(float* p, const float* g, float* m, float* v, int64_t b, int64_t e,
                 const AdamConsts& k) {
#ifdef __AVX512F__
  const __m512 gs = _mm512_set1_ps(k.gs), b1 = _mm512_set1_ps(k.b1), b2 = _mm512_set1_ps(k.b2);
  const __m512 c1 = _mm512_set1_ps(1.f - k.b1), c2 = _mm512_set1_ps(1.f - k.b2);
  const __m512 decay = _mm512_set1_ps(k.decay), lr = _mm512_set1_ps(k.lr);
  const __m512 rbc1 = _mm512_set1_ps(k.rbc1), rbc2 = _mm512_set1_ps(k.rbc2_sqrt);
  const __m512 eps = _mm512_set1_ps(k.eps);
  for (int64_t i = b; i < e; i += 16) {
    const __mmask16 mk = e - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (e - i)) - 1);
    __m512 gi = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, g + i), gs);
    __m512 mi = _mm512_fmadd_ps(b1, _mm512_maskz_loadu_ps(mk, m + i), _mm512_mul_ps(c1, gi));
    __m512 vi = _mm512_fmadd_ps(b2, _mm512_maskz_loadu_ps(mk, v + i),
                                _mm512_mul_ps(_mm512_mul_ps(c2, gi), gi));
    __m512 den = _mm512_fmadd_ps(_mm512_mask_sqrt_ps(vi, mk, vi), rbc2, eps);
    __m512 step = _mm512_div_ps(_mm512_mul_ps(lr, _mm512_mul_ps(mi, rbc1)), den);
    __m512 pi = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(mk, p + i), decay, step);
    _mm512_mask_storeu_ps(m + i, mk, mi);
    _mm512_mask_storeu_ps(v + i, mk, vi);
    _mm512_mask_storeu_ps(p + i, mk, pi);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 gs = _mm256_set1_ps(k.gs), b1 = _mm256_set1_ps(k.b1), b2 = _mm256_set1_ps(k.b2);
  const __m256 c1 = _mm256_set1_ps(1.f - k.b1), c2 = _mm256_set1_ps(1.f - k.b2);
  const __m256 decay = _mm256_set1_ps(k.decay), lr = _mm256_set1_ps(k.lr);
  const __m256 rbc1 = _mm256_set1_ps(k.rbc1), rbc2 = _mm256_set1_ps(k.rbc2_sqrt);
  const __m256 eps = _mm256_set1_ps(k.eps);
  // Lane j of the tail mask is on when j < the lanes left (maskload reads 0 elsewhere).
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = b; i < e; i += 8) {
    const __m256i mk =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(std::min<int64_t>(e - i, 8))), lane);
    __m256 gi = _mm256_mul_ps(_mm256_maskload_ps(g + i, mk), gs);
    __m256 mi = _mm256_fmadd_ps(b1, _mm256_maskload_ps(m + i, mk), _mm256_mul_ps(c1, gi));
    __m256 vi = _mm256_fmadd_ps(b2, _mm256_maskload_ps(v + i, mk),
                                _mm256_mul_ps(_mm256_mul_ps(c2, gi), gi));
    __m256 den = _mm256_fmadd_ps(_mm256_sqrt_ps(vi), rbc2, eps);
    __m256 step = _mm256_div_ps(_mm256_mul_ps(lr, _mm256_mul_ps(mi, rbc1)), den);
    __m256 pi = _mm256_fmsub_ps(_mm256_maskload_ps(p + i, mk), decay, step);
    _mm256_maskstore_ps(m + i, mk, mi);
    _mm256_maskstore_ps(v + i, mk, vi);
    _mm256_maskstore_ps(p + i, mk, pi);
  }
#else
  for (int64_t i = b; i < e; ++i) adamw_one(p, g, m, v, i, k);
#endif
}

// copy == nullptr: no compute-dtype copy. Work goes in L1-sized blocks so the
// copy re-reads params from cache.
template <typename C>
void adamw_kernel(float* p, const float* g, float* m, float* v, C* copy, int64_t n,
                  const AdamConsts& k) {
  constexpr int64_t kBlock = 1024;
  parallel_for(n, 1 << 15, [&](int64_t b, int64_t e) {
    for (int64_t s = b; s < e; s += kBlock) {
      const int64_t t = std::min(e, s + kBlock);
      adamw_range(p, g, m, v, s, t, k);
      if (copy)
        for (int64_t i = s; i < t; ++i) copy[i] = store<C>(p[i]);
    }
  });
}

}  // namespace

void adamw_step(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWParams& p,
                Tensor param_copy) {
  const AdamConsts k = adam_consts(p);
  float *pp = param.data<float>(), *pm = m.data<float>(), *pv = v.data<float>();
  const float* pg = grad.data<float>();
  const int64_t n = param.numel();
  if (!param_copy.defined()) {
    adamw_kernel<float>(pp, pg, pm, pv, nullptr, n, k);
    return;
  }
  dispatch_float(param_copy.dtype(), "adamw_step", [&](auto tag) {
    adamw_kernel(pp, pg, pm, pv, param_copy.data<decltype(tag)>(), n, k);
  });
}

}  // namespace nk::ops::NK_CPU_NS

// ---- adamw_step_mixed: the optimizer state in reduced precision ----
namespace nk::ops::NK_CPU_NS {
namespace {

// A bf16 master and the 16 bits its f32 value lost (TransformerEngine's
// "param remainders"): hi is the f32 pattern rounded to nearest with ties
// away from zero (adding half a bf16 ulp to the magnitude's bit pattern), so
// whether hi was rounded up is the remainder's top bit, and hi with the
// remainder gives the f32 pattern back exactly. Round-to-nearest-even could
// not be undone: on a tie the remainder would not say which way hi went.
inline float join_master(uint16_t hi, uint16_t lo) {
  uint32_t u = (uint32_t(hi) << 16) | lo;
  if (lo & 0x8000u) u -= 0x10000u;
  return std::bit_cast<float>(u);
}
inline void split_master(float x, uint16_t& hi, uint16_t& lo) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  lo = uint16_t(u);
  hi = (u & 0x7fffffffu) > 0x7f800000u ? uint16_t((u >> 16) | 0x40u)  // NaN stays NaN
                                       : uint16_t((u + 0x8000u) >> 16);
}

// f16 moments: m is stored as m / sm and v as sqrt(v) / sv. sqrt(v) has the
// dynamic range of |g| rather than its square (v of a gradient of 1e-4 is
// 1e-8, below f16's smallest normal 6e-5), and a per-tensor power-of-two
// scale, chosen each step from the new values' largest magnitude, puts that
// largest one in [2^14, 2^15): no overflow (f16 max 65504), values down to
// 2^-29 of the largest keep f16's 11 bits, to 2^-39 some of them; powers of
// two make the scaling itself exact. bf16 has f32's exponent range, so bf16
// moments are m and v as they are.
struct MomentScales {
  float m = 1.f, v = 1.f;          // read: the stored values' scales
  float inv_m = 1.f, inv_v = 1.f;  // write: 1 / the new scales
};

template <typename M>
inline void load_moments(const M* m, const M* v, int64_t i, const MomentScales& s, float& mi,
                         float& vi) {
  if constexpr (std::is_same_v<M, f16>) {
    mi = load(m[i]) * s.m;
    const float r = load(v[i]) * s.v;
    vi = r * r;
  } else {
    mi = load(m[i]);
    vi = load(v[i]);
  }
}

template <typename M>
inline void store_moments(M* m, M* v, int64_t i, const MomentScales& s, float mi, float vi) {
  if constexpr (std::is_same_v<M, f16>) {
    m[i] = store<f16>(mi * s.inv_m);
    v[i] = store<f16>(std::sqrt(vi) * s.inv_v);
  } else {
    m[i] = store<M>(mi);
    v[i] = store<M>(vi);
  }
}

inline void atomic_max(std::atomic<uint32_t>& a, float x) {
  // Non-negative floats order as their bit patterns.
  uint32_t b = std::bit_cast<uint32_t>(x), cur = a.load(std::memory_order_relaxed);
  while (b > cur && !a.compare_exchange_weak(cur, b, std::memory_order_relaxed)) {
  }
}

// One pass over [0, n). maxes != nullptr: only measure the new moments'
// largest |m| and sqrt(v) (f16's first pass); else update and store.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define NK_ADAMW_MIXED_AVX512 1
// GCC 12's intrinsics (slli/srli, cvtepu16, sqrt, max) start from
// _mm512_undefined_*(), which -Wmaybe-uninitialized flags once inlined here
// (clang has no such warning).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// 16 lanes of 16-bit values <-> f32 lanes of their bits (u32) or values.
inline __m512i load_u16(const void* p, __mmask16 k) {
  return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p));
}
inline void store_u16(void* p, __mmask16 k, __m512i u) {
  _mm256_mask_storeu_epi16(p, k, _mm512_cvtepi32_epi16(u));
}
inline __m512 widen_bf16(__m512i u) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}
// store<bf16>'s rounding (nearest even, NaN kept quiet), 16 lanes.
inline __m512i round_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_epi32(r, nan,
                               _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
}

template <typename M>
inline __m512 load_moment(const M* p, int64_t i, __mmask16 k) {
  if constexpr (std::is_same_v<M, float>)
    return _mm512_maskz_loadu_ps(k, p + i);
  else if constexpr (std::is_same_v<M, bf16>)
    return widen_bf16(load_u16(p + i, k));
  else
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p + i));
}

template <typename M>
inline void store_moment(M* p, int64_t i, __mmask16 k, __m512 x) {
  if constexpr (std::is_same_v<M, float>)
    _mm512_mask_storeu_ps(p + i, k, x);
  else if constexpr (std::is_same_v<M, bf16>)
    store_u16(p + i, k, round_bf16(x));
  else
    _mm256_mask_storeu_epi16(p + i, k,
                             _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// mixed_pass's loop over [lo, hi), 16 lanes at a time; the tail is masked so
// every element takes the same instructions whatever the chunking.
template <typename M, MasterKind K, typename C>
void mixed_range(const MixedBuffers& b, M* m, M* v, C* copy, int64_t lo, int64_t hi,
                 const AdamConsts& k, const MomentScales& s, bool measure, float& max_m,
                 float& max_r) {
  const __m512 gs = _mm512_set1_ps(k.gs), b1 = _mm512_set1_ps(k.b1), b2 = _mm512_set1_ps(k.b2);
  const __m512 c1 = _mm512_set1_ps(1.f - k.b1), c2 = _mm512_set1_ps(1.f - k.b2);
  const __m512 decay = _mm512_set1_ps(k.decay), lr = _mm512_set1_ps(k.lr);
  const __m512 rbc1 = _mm512_set1_ps(k.rbc1), rbc2 = _mm512_set1_ps(k.rbc2_sqrt);
  const __m512 eps = _mm512_set1_ps(k.eps);
  const __m512 sm = _mm512_set1_ps(s.m), sv = _mm512_set1_ps(s.v);
  const __m512 inv_m = _mm512_set1_ps(s.inv_m), inv_v = _mm512_set1_ps(s.inv_v);
  __m512 vmax_m = _mm512_setzero_ps(), vmax_r = _mm512_setzero_ps();
  for (int64_t i = lo; i < hi; i += 16) {
    const __mmask16 mk = hi - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (hi - i)) - 1);
    const __m512 gi = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, b.g + i), gs);
    __m512 mi = load_moment(m, i, mk), vi = load_moment(v, i, mk);
    if constexpr (std::is_same_v<M, f16>) {  // m / sm and sqrt(v) / sv stored
      mi = _mm512_mul_ps(mi, sm);
      vi = _mm512_mul_ps(vi, sv);
      vi = _mm512_mul_ps(vi, vi);
    }
    mi = _mm512_fmadd_ps(b1, mi, _mm512_mul_ps(c1, gi));
    vi = _mm512_fmadd_ps(b2, vi, _mm512_mul_ps(_mm512_mul_ps(c2, gi), gi));
    const __m512 root = _mm512_sqrt_ps(vi);
    if (measure) {
      vmax_m = _mm512_max_ps(vmax_m, _mm512_abs_ps(mi));
      vmax_r = _mm512_max_ps(vmax_r, root);
      continue;
    }
    __m512 p;
    if constexpr (K == MasterKind::F32) {
      p = _mm512_maskz_loadu_ps(mk, b.master32 + i);
    } else if constexpr (K == MasterKind::Bf16Remainder) {
      const __m512i h = load_u16(b.master16 + i, mk), r = load_u16(b.remainder + i, mk);
      __m512i u = _mm512_or_si512(_mm512_slli_epi32(h, 16), r);
      const __mmask16 up = _mm512_test_epi32_mask(r, _mm512_set1_epi32(0x8000));
      u = _mm512_mask_sub_epi32(u, up, u, _mm512_set1_epi32(0x10000));
      p = _mm512_castsi512_ps(u);
    } else {
      p = widen_bf16(load_u16(b.master16 + i, mk));
    }
    const __m512 den = _mm512_fmadd_ps(root, rbc2, eps);
    const __m512 step = _mm512_div_ps(_mm512_mul_ps(lr, _mm512_mul_ps(mi, rbc1)), den);
    p = _mm512_fmsub_ps(p, decay, step);
    if constexpr (std::is_same_v<M, f16>) {
      store_moment(m, i, mk, _mm512_mul_ps(mi, inv_m));
      store_moment(v, i, mk, _mm512_mul_ps(root, inv_v));
    } else {
      store_moment(m, i, mk, mi);
      store_moment(v, i, mk, vi);
    }
    if constexpr (K == MasterKind::F32) {
      _mm512_mask_storeu_ps(b.master32 + i, mk, p);
      if (copy) store_moment(copy, i, mk, p);
    } else if constexpr (K == MasterKind::Bf16Remainder) {
      const __m512i u = _mm512_castps_si512(p);
      const __m512i lo16 = _mm512_and_si512(u, _mm512_set1_epi32(0xffff));
      __m512i hi16 = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x8000)), 16);
      const __mmask16 nan = _mm512_cmpgt_epu32_mask(
          _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
      hi16 = _mm512_mask_mov_epi32(
          hi16, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
      store_u16(b.master16 + i, mk, hi16);
      store_u16(b.remainder + i, mk, lo16);
    } else {
      store_u16(b.master16 + i, mk, round_bf16(p));
    }
  }
  if (measure) {
    max_m = std::max(max_m, _mm512_reduce_max_ps(vmax_m));
    max_r = std::max(max_r, _mm512_reduce_max_ps(vmax_r));
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define NK_ADAMW_MIXED_AVX2 1
// The AVX-512 loop's operations in the same order, 8 lanes at a time (so the
// two levels give the same bits). AVX2 has no masked 16-bit loads: the tail
// goes through zero-padded local copies and the same instructions.
inline __m256i load_u16(const void* p) {
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p)));
}
// Lanes below 2^16 back to 16 bits (packus saturates nothing there).
inline void store_u16(void* p, __m256i u) {
  _mm_storeu_si128(static_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)));
}
// Lanes holding a NaN pattern (both sides below 2^31, so the signed compare
// orders them).
inline __m256i nan_lanes(__m256i u) {
  return _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                            _mm256_set1_epi32(0x7f800000));
}
// store<bf16>'s rounding (nearest even, NaN kept quiet), 8 lanes.
inline __m256i round_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
  return _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)),
                            nan_lanes(u));
}

template <typename M>
inline void store_moment(M* p, __m256 x) {
  if constexpr (std::is_same_v<M, float>)
    _mm256_storeu_ps(p, x);
  else if constexpr (std::is_same_v<M, bf16>)
    store_u16(p, round_bf16(x));
  else
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// The step's constants as vectors.
struct MixedConsts8 {
  __m256 gs, b1, b2, c1, c2, decay, lr, rbc1, rbc2, eps, sm, sv, inv_m, inv_v;
  MixedConsts8(const AdamConsts& k, const MomentScales& s)
      : gs(_mm256_set1_ps(k.gs)),
        b1(_mm256_set1_ps(k.b1)),
        b2(_mm256_set1_ps(k.b2)),
        c1(_mm256_set1_ps(1.f - k.b1)),
        c2(_mm256_set1_ps(1.f - k.b2)),
        decay(_mm256_set1_ps(k.decay)),
        lr(_mm256_set1_ps(k.lr)),
        rbc1(_mm256_set1_ps(k.rbc1)),
        rbc2(_mm256_set1_ps(k.rbc2_sqrt)),
        eps(_mm256_set1_ps(k.eps)),
        sm(_mm256_set1_ps(s.m)),
        sv(_mm256_set1_ps(s.v)),
        inv_m(_mm256_set1_ps(s.inv_m)),
        inv_v(_mm256_set1_ps(s.inv_v)) {}
};

// Eight elements from b's buffers, m, v and copy, each at its first element.
template <typename M, MasterKind K, typename C>
inline void mixed8(const MixedBuffers& b, M* m, M* v, C* copy, const MixedConsts8& c, bool measure,
                   __m256& vmax_m, __m256& vmax_r) {
  const __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(b.g), c.gs);
  __m256 mi = load8<M>(m), vi = load8<M>(v);
  if constexpr (std::is_same_v<M, f16>) {  // m / sm and sqrt(v) / sv stored
    mi = _mm256_mul_ps(mi, c.sm);
    vi = _mm256_mul_ps(vi, c.sv);
    vi = _mm256_mul_ps(vi, vi);
  }
  mi = _mm256_fmadd_ps(c.b1, mi, _mm256_mul_ps(c.c1, gi));
  vi = _mm256_fmadd_ps(c.b2, vi, _mm256_mul_ps(_mm256_mul_ps(c.c2, gi), gi));
  const __m256 root = _mm256_sqrt_ps(vi);
  if (measure) {
    const __m256 abs_mi = _mm256_and_ps(mi, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
    vmax_m = _mm256_max_ps(vmax_m, abs_mi);
    vmax_r = _mm256_max_ps(vmax_r, root);
    return;
  }
  __m256 p;
  if constexpr (K == MasterKind::F32) {
    p = _mm256_loadu_ps(b.master32);
  } else if constexpr (K == MasterKind::Bf16Remainder) {
    const __m256i h = load_u16(b.master16), r = load_u16(b.remainder);
    const __m256i u = _mm256_or_si256(_mm256_slli_epi32(h, 16), r);
    const __m256i up = _mm256_cmpeq_epi32(_mm256_and_si256(r, _mm256_set1_epi32(0x8000)),
                                          _mm256_set1_epi32(0x8000));
    p = _mm256_castsi256_ps(_mm256_sub_epi32(u, _mm256_and_si256(up, _mm256_set1_epi32(0x10000))));
  } else {
    p = load8<bf16>(b.master16);
  }
  const __m256 den = _mm256_fmadd_ps(root, c.rbc2, c.eps);
  const __m256 step = _mm256_div_ps(_mm256_mul_ps(c.lr, _mm256_mul_ps(mi, c.rbc1)), den);
  p = _mm256_fmsub_ps(p, c.decay, step);
  if constexpr (std::is_same_v<M, f16>) {
    store_moment(m, _mm256_mul_ps(mi, c.inv_m));
    store_moment(v, _mm256_mul_ps(root, c.inv_v));
  } else {
    store_moment(m, mi);
    store_moment(v, vi);
  }
  if constexpr (K == MasterKind::F32) {
    _mm256_storeu_ps(b.master32, p);
    if (copy) store_moment(copy, p);
  } else if constexpr (K == MasterKind::Bf16Remainder) {
    const __m256i u = _mm256_castps_si256(p);
    const __m256i lo16 = _mm256_and_si256(u, _mm256_set1_epi32(0xffff));
    const __m256i hi16 = _mm256_blendv_epi8(
        _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x8000)), 16),
        _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan_lanes(u));
    store_u16(b.master16, hi16);
    store_u16(b.remainder, lo16);
  } else {
    store_u16(b.master16, round_bf16(p));
  }
}

// b's buffers moved on by i elements.
inline MixedBuffers offset(const MixedBuffers& b, int64_t i) {
  MixedBuffers o;
  o.g = b.g + i;
  if (b.master32) o.master32 = b.master32 + i;
  if (b.master16) o.master16 = b.master16 + i;
  if (b.remainder) o.remainder = b.remainder + i;
  return o;
}

template <typename M, MasterKind K, typename C>
void mixed_range(const MixedBuffers& b, M* m, M* v, C* copy, int64_t lo, int64_t hi,
                 const AdamConsts& k, const MomentScales& s, bool measure, float& max_m,
                 float& max_r) {
  const MixedConsts8 c(k, s);
  __m256 vmax_m = _mm256_setzero_ps(), vmax_r = _mm256_setzero_ps();
  int64_t i = lo;
  for (; i + 8 <= hi; i += 8)
    mixed8<M, K, C>(offset(b, i), m + i, v + i, copy ? copy + i : nullptr, c, measure, vmax_m,
                    vmax_r);
  if (const int64_t n = hi - i; n > 0) {  // the tail, zero-padded (max and stores unaffected)
    alignas(32) float g8[8] = {}, master8[8] = {};
    alignas(32) uint16_t hi8[8] = {}, rem8[8] = {};
    alignas(32) M m8[8] = {}, v8[8] = {};
    alignas(32) C copy8[8] = {};
    MixedBuffers t;
    t.g = g8;
    std::copy_n(b.g + i, n, g8);
    std::copy_n(m + i, n, m8);
    std::copy_n(v + i, n, v8);
    if (b.master32) std::copy_n(b.master32 + i, n, (t.master32 = master8));
    if (b.master16) std::copy_n(b.master16 + i, n, (t.master16 = hi8));
    if (b.remainder) std::copy_n(b.remainder + i, n, (t.remainder = rem8));
    mixed8<M, K, C>(t, m8, v8, copy ? copy8 : nullptr, c, measure, vmax_m, vmax_r);
    if (!measure) {
      std::copy_n(m8, n, m + i);
      std::copy_n(v8, n, v + i);
      if (b.master32) std::copy_n(master8, n, b.master32 + i);
      if (b.master16) std::copy_n(hi8, n, b.master16 + i);
      if (b.remainder) std::copy_n(rem8, n, b.remainder + i);
      if (copy) std::copy_n(copy8, n, copy + i);
    }
  }
  if (measure) {
    alignas(32) float lanes_m[8], lanes_r[8];
    _mm256_store_ps(lanes_m, vmax_m);
    _mm256_store_ps(lanes_r, vmax_r);
    for (int j = 0; j < 8; ++j) {
      max_m = std::max(max_m, lanes_m[j]);
      max_r = std::max(max_r, lanes_r[j]);
    }
  }
}
#else
// Without AVX2 (no level of this build has that: a portable version of the
// loops above, element by element).
template <typename M, MasterKind K, typename C>
void mixed_range(const MixedBuffers& b, M* m, M* v, C* copy, int64_t lo, int64_t hi,
                 const AdamConsts& k, const MomentScales& s, bool measure, float& max_m,
                 float& max_r) {
  for (int64_t i = lo; i < hi; ++i) {
    const float gi = b.g[i] * k.gs;
    float mi, vi;
    load_moments(m, v, i, s, mi, vi);
    mi = k.b1 * mi + (1.f - k.b1) * gi;
    vi = k.b2 * vi + (1.f - k.b2) * gi * gi;
    if (measure) {
      max_m = std::max(max_m, std::fabs(mi));
      max_r = std::max(max_r, std::sqrt(vi));
      continue;
    }
    float p;
    if constexpr (K == MasterKind::F32)
      p = b.master32[i];
    else if constexpr (K == MasterKind::Bf16Remainder)
      p = join_master(b.master16[i], b.remainder[i]);
    else
      p = load(bf16{b.master16[i]});
    p = p * k.decay - k.lr * (mi * k.rbc1) / (std::sqrt(vi) * k.rbc2_sqrt + k.eps);
    store_moments(m, v, i, s, mi, vi);
    if constexpr (K == MasterKind::F32) {
      b.master32[i] = p;
      if (copy) copy[i] = store<C>(p);
    } else if constexpr (K == MasterKind::Bf16Remainder) {
      split_master(p, b.master16[i], b.remainder[i]);
    } else {
      b.master16[i] = store<bf16>(p).bits;
    }
  }
}
#endif

template <typename M, MasterKind K, typename C>
void mixed_pass(const MixedBuffers& b, M* m, M* v, C* copy, int64_t n, const AdamConsts& k,
                const MomentScales& s, std::atomic<uint32_t>* maxes) {
  parallel_for(n, 1 << 15, [&](int64_t lo, int64_t hi) {
    float max_m = 0.f, max_r = 0.f;
    mixed_range<M, K, C>(b, m, v, copy, lo, hi, k, s, maxes != nullptr, max_m, max_r);
    if (maxes) {
      atomic_max(maxes[0], max_m);
      atomic_max(maxes[1], max_r);
    }
  });
}

// The power of two putting `largest` in [2^14, 2^15) (1 for 0, inf or NaN:
// a non-finite moment stays so and the trainer's check reports it).
float f16_moment_scale(float largest) {
  if (!(largest > 0.f) || !std::isfinite(largest)) return 1.f;
  return std::ldexp(1.f, std::max(std::ilogb(largest) - 14, -126));
}

template <typename M, MasterKind K, typename C>
void mixed_step(const MixedBuffers& b, M* m, M* v, C* copy, float* scales, int64_t n,
                const AdamConsts& k) {
  MomentScales s;
  if constexpr (std::is_same_v<M, f16>) {
    s.m = scales[0];
    s.v = scales[1];
    std::atomic<uint32_t> maxes[2] = {0u, 0u};
    mixed_pass<M, K, C>(b, m, v, copy, n, k, s, maxes);
    const float new_m = f16_moment_scale(std::bit_cast<float>(maxes[0].load()));
    const float new_v = f16_moment_scale(std::bit_cast<float>(maxes[1].load()));
    s.inv_m = 1.f / new_m;
    s.inv_v = 1.f / new_v;
    mixed_pass<M, K, C>(b, m, v, copy, n, k, s, nullptr);
    scales[0] = new_m;
    scales[1] = new_v;
  } else {
    mixed_pass<M, K, C>(b, m, v, copy, n, k, s, nullptr);
  }
}

// adamw_step_mixed's instantiations (ops/adamw_step.h picks one).
struct MixedStep {
  float* scales;
  int64_t n;
  AdamConsts k;
  template <typename M, MasterKind K, typename C>
  void run(const MixedBuffers& b, M* m, M* v, C* copy) const {
    mixed_step<M, K, C>(b, m, v, copy, scales, n, k);
  }
};

}  // namespace

void adamw_step_mixed(Tensor master, Tensor remainder, const Tensor& grad, Tensor m, Tensor v,
                      Tensor scales, const AdamWParams& p, Tensor param_copy) {
  const int64_t n = master.numel();
  const MixedStep step{scales.defined() ? scales.data<float>() : nullptr, n, adam_consts(p)};
  dispatch_adamw_mixed(master, remainder, grad, m, v, param_copy, step);
}

void bf16_master_split(Tensor hi, Tensor remainder, const Tensor& f32) {
  const float* x = f32.data<float>();
  auto* h = reinterpret_cast<uint16_t*>(hi.raw());
  auto* r = remainder.defined() ? reinterpret_cast<uint16_t*>(remainder.raw()) : nullptr;
  parallel_for(f32.numel(), 1 << 16, [&](int64_t lo, int64_t e) {
    for (int64_t i = lo; i < e; ++i) {
      uint16_t a, b;
      split_master(x[i], a, b);
      h[i] = a;
      if (r) r[i] = b;
    }
  });
}

void bf16_master_join(Tensor f32, const Tensor& hi, const Tensor& remainder) {
  float* x = f32.data<float>();
  const auto* h = reinterpret_cast<const uint16_t*>(hi.raw());
  const auto* r =
      remainder.defined() ? reinterpret_cast<const uint16_t*>(remainder.raw()) : nullptr;
  parallel_for(f32.numel(), 1 << 16, [&](int64_t lo, int64_t e) {
    for (int64_t i = lo; i < e; ++i) x[i] = r ? join_master(h[i], r[i]) : load(bf16{h[i]});
  });
}

}  // namespace nk::ops::NK_CPU_NS
