// Quantised weights on the CPU, part 1: quantisers, reading values back, and
// the embedding (arguments checked by ops/quant.cc; layouts in ops/quant.h).
// The products are in quant_linear.cc and quant_dot.cc.
//
// ggml's reference Q4_0 quantiser rounds x (1 / d) to f32 before adding 8.5 (C
// compiled without contraction); GCC's default -ffp-contract=fast would fuse
// the two into one FMA and move ties, so contraction is off in this file.
// (The dequantisers' products of f16 scales and small integer codes are
// mostly exact in f32, but they too are the layouts' separately rounded
// operations.)
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"
#include "ops/cpu/quant_blocks.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace nk::ops::NK_CPU_NS {
namespace {

constexpr float kHalfMax = 65504.f;

float max_abs(const float* x, int n) {
  float a = 0.f;
  for (int i = 0; i < n; ++i) a = std::max(a, std::fabs(x[i]));
  return a;
}

// ---- Q8_0 and Q4_0: one scale per 32 values ----

}  // namespace

// d = max|x| / 127 rounded to f16; q = round(x / d) with the stored d, so
// |x - d q| <= d / 2 (half away from zero, as ggml's roundf).
void quantize_q8_0(const float* x, int64_t n, BlockQ8_0* y) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    const uint16_t h = float_to_half(max_abs(x, kQK) / 127.f);
    const float d = half_to_float(h), id = d > 0.f ? 1.f / d : 0.f;
    y[b].d = h;
    // Nearest-even of x times the stored scale's inverse: the bytes Nekton's
    // q8_0 GGUF exports have always had.
    for (int j = 0; j < kQK; ++j)
      y[b].qs[j] = int8_t(std::clamp(std::nearbyint(x[j] * id), -127.f, 127.f));
  }
}

namespace {

// ggml's quantize_row_q4_0_ref: d = (the value of largest magnitude) / -8,
// so it maps to level 0 exactly; q = min(15, trunc(x (1 / d) + 8.5)) with the
// unrounded d.
void quantize_q4_0(const float* x, int64_t n, BlockQ4_0* y) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    float amax = 0.f, vmax = 0.f;
    for (int j = 0; j < kQK; ++j)
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        vmax = x[j];
      }
    const float d = vmax / -8.f, id = d != 0.f ? 1.f / d : 0.f;
    y[b].d = float_to_half(d);
    auto level = [&](float v) {
      const float scaled = v * id;
      return uint8_t(std::min(15, int(int8_t(scaled + 8.5f))));
    };
    for (int j = 0; j < kQK / 2; ++j)
      y[b].qs[j] = uint8_t(level(x[j]) | level(x[j + kQK / 2]) << 4);
  }
}

// ---- Q4_K: 8 sub-blocks of 32, each s q - m with q in [0, 15] ----

struct ScaleMin {
  float s, m;  // value = s q - m, s >= 0, m >= 0
};

// The K types' searches round v (1 / s) to the nearest level (ties to even),
// multiplying by the inverse: they run per candidate and value, and which of
// two equally good levels is taken does not matter to them.
float level(float v, float inv, float lo, float hi) {
  return std::clamp(std::nearbyint(v * inv), lo, hi);
}

// Squared error of x[0, n) coded as s q - m with q the nearest level.
float err_scale_min(const float* x, int n, float s, float m, int levels) {
  const float inv = s > 0.f ? 1.f / s : 0.f;
  float e = 0.f;
  for (int i = 0; i < n; ++i) {
    const float q = level(x[i] + m, inv, 0.f, float(levels - 1));
    const float r = s * q - m - x[i];
    e += r * r;
  }
  return e;
}

// The least-squares (s, m) for fixed levels q (the offset -m kept <= 0).
ScaleMin refit_scale_min(const float* x, const float* q, int n) {
  double sq = 0, sqq = 0, sx = 0, sxq = 0;
  for (int i = 0; i < n; ++i) {
    sq += q[i];
    sqq += double(q[i]) * q[i];
    sx += x[i];
    sxq += double(x[i]) * q[i];
  }
  const double det = n * sqq - sq * sq;
  if (det > 0) {
    const double s = (n * sxq - sq * sx) / det, b = (sx - s * sq) / n;
    if (b <= 0 && s >= 0) return {float(s), float(-b)};
  }
  return {sqq > 0 ? float(std::max(0.0, sxq / sqq)) : 0.f, 0.f};
}

// The (s, m) of x[0, n) minimising the squared error: levels from several
// spans around [min(x, 0), max(x)], each refitted by least squares twice.
ScaleMin fit_scale_min(const float* x, int n, int levels) {
  float lo = 0.f, hi = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (hi <= lo) return {0.f, -lo};  // every value equal to lo <= 0
  ScaleMin best{(hi - lo) / float(levels - 1), -lo};
  float best_err = err_scale_min(x, n, best.s, best.m, levels);
  float q[kQKK];
  for (int step = -6; step <= 10; ++step) {
    ScaleMin c{(hi - lo) / (float(levels - 1) + 0.1f * float(step)), -lo};
    for (int iter = 0; iter < 2 && c.s > 0.f; ++iter) {
      const float inv = 1.f / c.s;
      for (int i = 0; i < n; ++i) q[i] = level(x[i] + c.m, inv, 0.f, float(levels - 1));
      c = refit_scale_min(x, q, n);
    }
    const float e = err_scale_min(x, n, c.s, c.m, levels);
    if (e < best_err) {
      best_err = e;
      best = c;
    }
  }
  return best;
}

// A 6-bit code near v / unit (0 where unit is 0).
int code6(float v, float unit) {
  return unit > 0.f ? std::clamp(int(std::lround(v / unit)), 0, 63) : 0;
}

void quantize_q4_k_block(const float* x, BlockQ4_K& y) {
  ScaleMin sm[8];
  float smax = 0.f, mmax = 0.f;
  for (int j = 0; j < 8; ++j) {
    sm[j] = fit_scale_min(x + 32 * j, 32, 16);
    smax = std::max(smax, sm[j].s);
    mmax = std::max(mmax, sm[j].m);
  }
  y.d = float_to_half(smax / 63.f);
  y.dmin = float_to_half(mmax / 63.f);
  const float d = half_to_float(y.d), dmin = half_to_float(y.dmin);
  // 6-bit codes, then the best of their neighbours given the stored scales.
  Q4KScales codes;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    const int s0 = code6(sm[j].s, d), m0 = code6(sm[j].m, dmin);
    float best = std::numeric_limits<float>::infinity();
    for (int s = std::max(0, s0 - 1); s <= std::min(63, s0 + 1); ++s)
      for (int m = std::max(0, m0 - 1); m <= std::min(63, m0 + 1); ++m) {
        const float e = err_scale_min(xs, 32, d * float(s), dmin * float(m), 16);
        if (e < best) {
          best = e;
          codes.sc[j] = uint8_t(s);
          codes.m[j] = uint8_t(m);
        }
      }
  }
  q4k_pack_scales(codes, y.scales);
  // Levels against the stored scales, formed as the layout forms them.
  uint8_t q[kQKK];
  for (int j = 0; j < 8; ++j) {
    const float s = d * float(codes.sc[j]), m = dmin * float(codes.m[j]);
    const float inv = s > 0.f ? 1.f / s : 0.f;
    for (int i = 0; i < 32; ++i) q[32 * j + i] = uint8_t(level(x[32 * j + i] + m, inv, 0.f, 15.f));
  }
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 32; ++i)
      y.qs[32 * c + i] = uint8_t(q[64 * c + i] | q[64 * c + 32 + i] << 4);
}

// ---- Q6_K: 16 sub-blocks of 16, each s (q - 32) with q in [0, 63] ----

// Squared error of x[0, n) coded as s q with q in [-32, 31] the nearest level.
float err_scale(const float* x, int n, float s) {
  const float inv = s != 0.f ? 1.f / s : 0.f;
  float e = 0.f;
  for (int i = 0; i < n; ++i) {
    const float q = level(x[i], inv, -32.f, 31.f);
    const float r = s * q - x[i];
    e += r * r;
  }
  return e;
}

// The scale of x[0, n) minimising the squared error: the value of largest
// magnitude v at or near level -32 (s = v / -t, the sign of s free as the
// layout's i8 scales allow), each candidate refitted by least squares.
float fit_scale(const float* x, int n) {
  float v = 0.f;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(v)) v = x[i];
  if (v == 0.f) return 0.f;
  float best = v / -32.f, best_err = err_scale(x, n, best);
  for (int step = -8; step <= 8; ++step) {
    float s = v / -(32.f + 0.125f * float(step));
    const float inv = 1.f / s;
    double sxq = 0, sqq = 0;
    for (int i = 0; i < n; ++i) {
      const double q = level(x[i], inv, -32.f, 31.f);
      sxq += x[i] * q;
      sqq += q * q;
    }
    if (sqq > 0) s = float(sxq / sqq);
    const float e = err_scale(x, n, s);
    if (e < best_err) {
      best_err = e;
      best = s;
    }
  }
  return best;
}

void quantize_q6_k_block(const float* x, BlockQ6_K& y) {
  float s[16], smax = 0.f;
  for (int j = 0; j < 16; ++j) {
    s[j] = fit_scale(x + 16 * j, 16);
    smax = std::max(smax, std::fabs(s[j]));
  }
  y.d = float_to_half(smax / 127.f);
  const float d = half_to_float(y.d);
  uint8_t q[kQKK];
  for (int j = 0; j < 16; ++j) {
    const float* xs = x + 16 * j;
    const int c0 = d > 0.f ? std::clamp(int(std::lround(s[j] / d)), -127, 127) : 0;
    int code = c0;
    float best = std::numeric_limits<float>::infinity();
    for (int c = std::max(-127, c0 - 1); c <= std::min(127, c0 + 1); ++c) {
      const float e = err_scale(xs, 16, d * float(c));
      if (e < best) {
        best = e;
        code = c;
      }
    }
    y.scales[j] = int8_t(code);
    const float sj = d * float(code), inv = sj != 0.f ? 1.f / sj : 0.f;
    for (int i = 0; i < 16; ++i) q[16 * j + i] = uint8_t(int(level(xs[i], inv, -32.f, 31.f)) + 32);
  }
  std::fill(y.qh, y.qh + sizeof(y.qh), uint8_t(0));
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const uint8_t v = q[128 * h + 32 * k + l];
        uint8_t& lo = y.ql[64 * h + l + 32 * (k & 1)];
        lo = k < 2 ? uint8_t(v & 15) : uint8_t(lo | (v & 15) << 4);
        y.qh[32 * h + l] |= uint8_t((v >> 4) << (2 * k));
      }
}

// ---- int8 per output channel ----

float quantize_w8(const float* x, int64_t n, int8_t* q) {
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax / 127.f;
  for (int64_t i = 0; i < n; ++i)
    q[i] = scale > 0.f ? int8_t(std::clamp(std::round(x[i] / scale), -127.f, 127.f)) : 0;
  return scale;
}

// One row of `in` values into its bytes (and the row's scale for W8*).
void quantize_row(QuantType t, const float* x, int64_t in, uint8_t* row, float* scale) {
  switch (t) {
    case QuantType::Q8_0:
      return quantize_q8_0(x, in, reinterpret_cast<BlockQ8_0*>(row));
    case QuantType::Q4_0:
      return quantize_q4_0(x, in, reinterpret_cast<BlockQ4_0*>(row));
    case QuantType::Q4_K:
      for (int64_t b = 0; b < in / kQKK; ++b)
        quantize_q4_k_block(x + b * kQKK, reinterpret_cast<BlockQ4_K*>(row)[b]);
      return;
    case QuantType::Q6_K:
      for (int64_t b = 0; b < in / kQKK; ++b)
        quantize_q6_k_block(x + b * kQKK, reinterpret_cast<BlockQ6_K*>(row)[b]);
      return;
    case QuantType::W8A16:
    case QuantType::W8A8:
      *scale = quantize_w8(x, in, reinterpret_cast<int8_t*>(row));
      return;
    case QuantType::F16:
      for (int64_t i = 0; i < in; ++i) {
        const uint16_t h = f32_to_f16(x[i]).bits;
        std::memcpy(row + 2 * i, &h, 2);
      }
      return;
    case QuantType::BF16:
      for (int64_t i = 0; i < in; ++i) {
        const uint16_t h = store<bf16>(x[i]).bits;
        std::memcpy(row + 2 * i, &h, 2);
      }
      return;
  }
}

// The largest |x| whose block scales stay inside f16's range (2x margin for
// the K types' searched scales, which may exceed max|x| / levels a little).
float max_quantisable(QuantType t) {
  switch (t) {
    case QuantType::Q8_0:
      return kHalfMax * 127.f;
    case QuantType::Q4_0:
      return kHalfMax * 8.f;
    case QuantType::Q4_K:  // dmin = max m / 63, with m up to max|x|
      return kHalfMax * 63.f / 2.f;
    case QuantType::Q6_K:
      return kHalfMax * 127.f * 16.f;
    case QuantType::F16:
      return kHalfMax;
    case QuantType::BF16:  // the largest f32 that rounds to a finite bf16
      return std::bit_cast<float>(0x7f7f7fffu);
    default:
      return std::numeric_limits<float>::max();
  }
}

// Every value finite and quantisable, checked before anything is written:
// otherwise an nk::Error naming the first offending row and column.
void check_quantisable(QuantType t, const float* w, int64_t rows, int64_t in) {
  const float limit = max_quantisable(t);
  auto ok = [&](float v) { return std::fabs(v) <= limit; };  // false for NaN
  std::vector<uint8_t> bad(size_t(rows), 0);
  parallel_for(rows, std::max<int64_t>(1, 65536 / in), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      bool all = true;
      for (int64_t c = 0; c < in; ++c) all &= ok(w[r * in + c]);
      bad[size_t(r)] = !all;
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    if (!bad[size_t(r)]) continue;
    int64_t c = 0;
    while (ok(w[r * in + c])) ++c;
    const float v = w[r * in + c];
    if (!std::isfinite(v))
      fail("quant_quantize: w has the non-finite value {} at row {}, column {}", v, r, c);
    fail("quant_quantize: w's value {} at row {}, column {} is too large for {} (|w| <= {})", v, r,
         c, quant_type_name(t), limit);
  }
}

// ---- reading back ----
//
// Each value as the layout defines it, in f32: a product (or two) rounded,
// then the difference (contraction is off in this file). The AVX2 loops
// compute the same operations eight values at a time, so both paths give
// the same bits; they make the prefill path's panels cheap.

#ifdef __AVX2__
// y[0, 32) = s_lo float(v[i]) - m_lo for i < 16, s_hi float(v[i]) - m_hi for
// i >= 16, v 32 signed bytes.
inline void put32(float* y, __m256i v, float s_lo, float s_hi, float m_lo, float m_hi) {
  const __m128i h[2] = {_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)};
  for (int k = 0; k < 4; ++k) {
    const __m128i bytes = k & 1 ? _mm_srli_si128(h[k / 2], 8) : h[k / 2];
    const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    const __m256 p = _mm256_mul_ps(f, _mm256_set1_ps(k < 2 ? s_lo : s_hi));
    _mm256_storeu_ps(y + 8 * k, _mm256_sub_ps(p, _mm256_set1_ps(k < 2 ? m_lo : m_hi)));
  }
}
inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
// Values 0..15 of a 16-byte nibble array (low nibbles), then 16..31 (high).
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(15));
}
#endif

}  // namespace

void dequant_q8_0(const BlockQ8_0* x, int64_t nb, float* y) {
  for (int64_t b = 0; b < nb; ++b, y += kQK) {
    const float d = half_to_float(x[b].d);
#ifdef __AVX2__
    put32(y, load32(x[b].qs), d, d, 0.f, 0.f);
#else
    for (int j = 0; j < kQK; ++j) y[j] = d * float(x[b].qs[j]);
#endif
  }
}

namespace {

void dequant_q4_0(const BlockQ4_0* x, int64_t nb, float* y) {
  for (int64_t b = 0; b < nb; ++b, y += kQK) {
    const float d = half_to_float(x[b].d);
#ifdef __AVX2__
    put32(y, _mm256_sub_epi8(nibbles(x[b].qs), _mm256_set1_epi8(8)), d, d, 0.f, 0.f);
#else
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = float((x[b].qs[j] & 15) - 8) * d;
      y[j + kQK / 2] = float((x[b].qs[j] >> 4) - 8) * d;
    }
#endif
  }
}

// x = (d sc) q - (dmin m): the two products formed first, as ggml does.
void dequant_q4_k(const BlockQ4_K* x, int64_t nb, float* y) {
  for (int64_t b = 0; b < nb; ++b) {
    const float d = half_to_float(x[b].d), dmin = half_to_float(x[b].dmin);
    const Q4KScales s = q4k_scales(x[b].scales);
    for (int c = 0; c < 4; ++c, y += 64) {
      const float d0 = d * float(s.sc[2 * c]), m0 = dmin * float(s.m[2 * c]);
      const float d1 = d * float(s.sc[2 * c + 1]), m1 = dmin * float(s.m[2 * c + 1]);
      const uint8_t* q = x[b].qs + 32 * c;
#ifdef __AVX2__
      const __m256i v = load32(q), low4 = _mm256_set1_epi8(15);
      put32(y, _mm256_and_si256(v, low4), d0, d0, m0, m0);
      put32(y + 32, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4), d1, d1, m1, m1);
#else
      for (int i = 0; i < 32; ++i) y[i] = d0 * float(q[i] & 15) - m0;
      for (int i = 0; i < 32; ++i) y[32 + i] = d1 * float(q[i] >> 4) - m1;
#endif
    }
  }
}

// x = (d scale) (q - 32), d scale formed first (ggml's d * sc[is] * q).
void dequant_q6_k(const BlockQ6_K* x, int64_t nb, float* y) {
  for (int64_t b = 0; b < nb; ++b) {
    const float d = half_to_float(x[b].d);
    for (int h = 0; h < 2; ++h, y += 128) {
      const uint8_t* ql = x[b].ql + 64 * h;
      const uint8_t* qh = x[b].qh + 32 * h;
      const int8_t* sc = x[b].scales + 8 * h;
#ifdef __AVX2__
      const __m256i low4 = _mm256_set1_epi8(15), bits45 = _mm256_set1_epi8(0x30);
      const __m256i l0 = load32(ql), l1 = load32(ql + 32), hb = load32(qh);
      const __m256i q[4] = {_mm256_or_si256(_mm256_and_si256(l0, low4),
                                            _mm256_and_si256(_mm256_slli_epi16(hb, 4), bits45)),
                            _mm256_or_si256(_mm256_and_si256(l1, low4),
                                            _mm256_and_si256(_mm256_slli_epi16(hb, 2), bits45)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                            _mm256_and_si256(hb, bits45)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                            _mm256_and_si256(_mm256_srli_epi16(hb, 2), bits45))};
      for (int k = 0; k < 4; ++k)
        put32(y + 32 * k, _mm256_sub_epi8(q[k], _mm256_set1_epi8(32)), d * float(sc[2 * k]),
              d * float(sc[2 * k + 1]), 0.f, 0.f);
#else
      for (int k = 0; k < 4; ++k) {
        const int shift = k < 2 ? 0 : 4;
        const uint8_t* lo = ql + 32 * (k & 1);
        for (int half = 0; half < 2; ++half) {  // 16 values of one scale
          const float s = d * float(sc[2 * k + half]);
          for (int l = 16 * half; l < 16 * half + 16; ++l) {
            const int q = ((lo[l] >> shift) & 15) | ((qh[l] >> (2 * k)) & 3) << 4;
            y[32 * k + l] = s * float(q - 32);
          }
        }
      }
#endif
    }
  }
}

void dequant_w8(const int8_t* q, float scale, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = scale * float(q[i]);
}

// Row r of q (all `in` values) into out as T, through a stack chunk for
// 16-bit T.
template <typename T>
void dequant_row_as(const QuantWeight& q, int64_t r, T* out) {
  thread_local std::vector<uint8_t> buf;
  const uint8_t* row = quant_row(q, r, buf);
  const float scale = q.scale.defined() ? q.scale.data<float>()[r] : 0.f;
  const int64_t in = q.cols();
  if constexpr (std::is_same_v<T, float>) {
    quant_dequant_row(q.type, row, scale, in, out);
  } else {
    constexpr int64_t kChunk = 1024;  // a multiple of every block
    float buf[kChunk];
    for (int64_t c0 = 0; c0 < in; c0 += kChunk) {
      const int64_t n = std::min(kChunk, in - c0);
      quant_dequant_row(q.type, row + quant_row_bytes(q.type, c0), scale, n, buf);
      for (int64_t i = 0; i < n; ++i) out[c0 + i] = store<T>(buf[i]);
    }
  }
}

template <typename T>
void dequant_rows(const QuantWeight& q, int64_t row0, int64_t n, T* out) {
  const int64_t in = q.cols();
  parallel_for(n, std::max<int64_t>(1, 16384 / in), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) dequant_row_as(q, row0 + r, out + r * in);
  });
}

// Row tok[t] - start of q for each token; a zero row for an id outside q's
// rows (another tensor-parallel rank's, when start >= 0).
template <typename T>
void embedding_rows(const QuantWeight& q, const int32_t* tok, int64_t n, int64_t start, T* out) {
  const int64_t C = q.cols(), V = q.rows();
  parallel_for(n, std::max<int64_t>(1, 16384 / C), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t row = int64_t(tok[t]) - start;
      if (row >= 0 && row < V)
        dequant_row_as(q, row, out + t * C);
      else
        std::fill(out + t * C, out + (t + 1) * C, T{});
    }
  });
}

// q's bytes, in the row layout, reordered in place into the packed one,
// a group of 16 rows at a time.
void pack_groups(QuantWeight& q) {
  const size_t rb = q.row_bytes();
  uint8_t* data = q.data.data<uint8_t>();
  parallel_for(q.rows() / kPackRows, 1, [&](int64_t g0, int64_t g1) {
    thread_local std::vector<uint8_t> rows;
    rows.resize(kPackRows * rb);
    for (int64_t g = g0; g < g1; ++g) {
      uint8_t* grp = data + g * kPackRows * rb;
      std::memcpy(rows.data(), grp, rows.size());
      for (size_t off = 0, u; off < rb; off += u) {
        u = packed_unit(q.type, off);
        for (int64_t i = 0; i < kPackRows; ++i)
          std::memcpy(grp + kPackRows * off + size_t(i) * u, rows.data() + size_t(i) * rb + off, u);
      }
    }
  });
}

}  // namespace

void quant_dequant_row(QuantType t, const uint8_t* row, float scale, int64_t n, float* out) {
  switch (t) {
    case QuantType::Q8_0:
      return dequant_q8_0(reinterpret_cast<const BlockQ8_0*>(row), n / kQK, out);
    case QuantType::Q4_0:
      return dequant_q4_0(reinterpret_cast<const BlockQ4_0*>(row), n / kQK, out);
    case QuantType::Q4_K:
      return dequant_q4_k(reinterpret_cast<const BlockQ4_K*>(row), n / kQKK, out);
    case QuantType::Q6_K:
      return dequant_q6_k(reinterpret_cast<const BlockQ6_K*>(row), n / kQKK, out);
    case QuantType::W8A16:
    case QuantType::W8A8:
      return dequant_w8(reinterpret_cast<const int8_t*>(row), scale, n, out);
    case QuantType::F16: {
      int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
      for (; i + 8 <= n; i += 8)  // exact: every half is an f32
        _mm256_storeu_ps(out + i, load8<f16>(row + 2 * i));
#endif
      for (; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, 2);
        out[i] = f16_to_f32(f16{h});
      }
      return;
    }
    case QuantType::BF16:  // exact: every bf16 is an f32
      return load_row(out, reinterpret_cast<const bf16*>(row), n);
  }
}

void quant_quantize(QuantWeight& q, const Tensor& w) {
  const int64_t rows = q.rows(), in = q.cols();
  const float* src = w.data<float>();
  check_quantisable(q.type, src, rows, in);
  uint8_t* dst = q.data.data<uint8_t>();
  float* scale = q.scale.defined() ? q.scale.data<float>() : nullptr;
  const size_t rb = q.row_bytes();
  // The K types search per sub-block: a few rows a chunk balance the threads.
  const int64_t grain = std::max<int64_t>(1, 4096 / in);
  parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      quantize_row(q.type, src + r * in, in, dst + size_t(r) * rb, scale ? scale + r : nullptr);
  });
  if (q.layout == QuantLayout::Packed16) pack_groups(q);  // written as rows, then reordered
}

const uint8_t* quant_row(const QuantWeight& q, int64_t r, std::vector<uint8_t>& buf) {
  const size_t rb = q.row_bytes();
  const uint8_t* data = q.data.data<uint8_t>();
  if (q.layout == QuantLayout::Rows) return data + size_t(r) * rb;
  buf.resize(rb);
  const uint8_t* g = data + size_t(r / kPackRows) * kPackRows * rb;
  const int64_t i = r % kPackRows;
  for (size_t off = 0, u; off < rb; off += u) {
    u = packed_unit(q.type, off);
    std::memcpy(buf.data() + off, g + kPackRows * off + size_t(i) * u, u);
  }
  return buf.data();
}

bool quant_pack(QuantWeight& q) {
  if (!quant_gemm_available(q.type, q.cols()) || q.rows() % kPackRows != 0) return false;
  pack_groups(q);
  q.layout = QuantLayout::Packed16;
  return true;
}

void quant_unpack(QuantWeight& rows, const QuantWeight& q) {
  const size_t rb = q.row_bytes();
  uint8_t* dst = rows.data.data<uint8_t>();
  parallel_for(q.rows(), std::max<int64_t>(1, 65536 / int64_t(rb)), [&](int64_t r0, int64_t r1) {
    thread_local std::vector<uint8_t> buf;
    for (int64_t r = r0; r < r1; ++r) std::memcpy(dst + size_t(r) * rb, quant_row(q, r, buf), rb);
  });
  if (q.scale.defined()) std::memcpy(rows.scale.raw(), q.scale.raw(), q.scale.nbytes());
}

void quant_dequantize(Tensor out, const QuantWeight& q, int64_t row0) {
  const int64_t n = rows_of(out);
  if (out.dtype() == DType::F32)
    dequant_rows(q, row0, n, out.data<float>());
  else
    dequant_rows(q, row0, n, out.data<bf16>());
}

void quant_embedding_forward(Tensor out, const Tensor& tokens, const QuantWeight& wte,
                             int64_t vocab_start) {
  const int64_t n = tokens.numel(), V = wte.rows();
  // Ids come from data files: a bad one is the user's error, found before any row is written.
  // (A shard of the vocabulary cannot tell another rank's ids from bad ones but for < 0.)
  const int32_t* tok = tokens.data<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    if (tok[i] < 0 || (vocab_start < 0 && tok[i] >= V))
      fail(
          "quant_embedding_forward: token id {} at position {} of tokens {} is outside the "
          "vocabulary [0, {})",
          tok[i], i, shape_str(tokens.shape()), V);
  const int64_t start = std::max<int64_t>(vocab_start, 0);
  if (out.dtype() == DType::F32)
    embedding_rows(wte, tok, n, start, out.data<float>());
  else
    embedding_rows(wte, tok, n, start, out.data<bf16>());
}

}  // namespace nk::ops::NK_CPU_NS
