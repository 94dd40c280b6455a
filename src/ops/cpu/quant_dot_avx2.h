// The AVX2 inner kernels of the direct quantised product (quant_dot.cc, which
// alone includes this): R weight rows against C quantised x rows, each
// kernel writing out[r * C + c] = sum over the row of w x (before a W8 row
// scale). Weight blocks are unpacked once per step and used for all C x
// rows; x blocks are loaded from L1 for each weight row.
//
// Integer work per block, f32 across blocks: u8 x i8 products with maddubs
// (i16 pairs, never saturating for these ranges: at most 2 * 63 * 127),
// summed to i32 by madd (with 1, or with the sub-block's scale), converted
// once per block (or super-block) and multiplied by the two scales in f32.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops/cpu/float_io.h"
#include "ops/cpu/level.h"
#include "ops/cpu/quant_blocks.h"

namespace nk::ops::NK_CPU_NS::quant_avx2 {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline __m128i load128(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

// Prefetches the lines of pf + [lo, hi): a later row group's bytes, spread
// over the steps of the current one. Rows are short (a 2048-value Q4_0 row is
// 1152 bytes) and hardware prefetchers stop at 4 KiB pages, so without this
// decode waits on memory at every page (2x slower, bench_quant cold).
inline void prefetch_span(const uint8_t* pf, size_t lo, size_t hi) {
  if (!pf) return;
  for (size_t off = lo & ~size_t(63); off < hi; off += 64)
    _mm_prefetch(reinterpret_cast<const char*>(pf + off), _MM_HINT_T0);
}

template <int R, int C>
void finish(__m256 (&acc)[R][C], float* out) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r * C + c] = hsum(acc[r][c]);
}

template <int R, int C>
void zero(__m256 (&acc)[R][C]) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
}

// Q8_0: |x| (u8) times w sign(x) sums x w without an i8 x i8 product.
template <int R, int C>
void dot_q8_0(const uint8_t* w, size_t rb, const QuantRow* x, int64_t in, float* out,
              const uint8_t* pf) {
  constexpr size_t kStep = R * sizeof(BlockQ8_0);
  __m256 acc[R][C];
  zero(acc);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < in / kQK; ++b) {
    prefetch_span(pf, size_t(b) * kStep, size_t(b + 1) * kStep);
    for (int r = 0; r < R; ++r) {
      const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(w + r * rb)[b];
      const __m256i q = load256(blk.qs);
      const float d = half_to_float(blk.d);
      for (int c = 0; c < C; ++c) {
        const __m256i p = _mm256_maddubs_epi16(load256(x[c].aq + b * kQK),
                                               _mm256_sign_epi8(q, load256(x[c].q + b * kQK)));
        const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
        acc[r][c] = _mm256_fmadd_ps(s, _mm256_set1_ps(d * x[c].d[b]), acc[r][c]);
      }
    }
  }
  finish(acc, out);
}

// Q4_0, two blocks a step: both blocks' 16 bytes in one register, so one
// mask and one shift give values j < 16 of both (low nibbles) and j >= 16
// (high nibbles), matched by x's qpair; sum (q - 8) x = sum q x - 8 sum x,
// the second from x's quad8. One madd, conversion and FMA serve both
// blocks, with scales [d0 x4 | d1 x4].
template <int R, int C>
void dot_q4_0(const uint8_t* w, size_t rb, const QuantRow* x, int64_t in, float* out,
              const uint8_t* pf) {
  constexpr size_t kStep = R * sizeof(BlockQ4_0);
  __m256 acc[R][C];
  zero(acc);
  const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(15);
  const __m256i halves = _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0);
  const int64_t nb = in / kQK;
  for (int64_t b = 0; b + 1 < nb; b += 2) {
    prefetch_span(pf, size_t(b) * kStep, size_t(b + 2) * kStep);
    for (int r = 0; r < R; ++r) {
      const BlockQ4_0* blk = reinterpret_cast<const BlockQ4_0*>(w + r * rb) + b;
      const __m256i q = _mm256_set_m128i(load128(blk[1].qs), load128(blk[0].qs));
      const __m256i lo = _mm256_and_si256(q, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      const __m128 dw = _mm_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(blk[0].d), blk[1].d, 1));
      for (int c = 0; c < C; ++c) {
        const int8_t* xq = x[c].qpair + b * kQK;
        const __m256i p =
            _mm256_sub_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, load256(xq)),
                                              _mm256_maddubs_epi16(hi, load256(xq + 32))),
                             load256(x[c].quad8 + b * 8));
        const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
        const __m128 dx =
            _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x[c].d + b)));
        const __m256 d =
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_mul_ps(dw, dx)), halves);
        acc[r][c] = _mm256_fmadd_ps(s, d, acc[r][c]);
      }
    }
  }
  if (nb & 1) {  // a last unpaired block, in 128-bit halves
    const int64_t b = nb - 1;
    const __m128i m4 = _mm_set1_epi8(15), ones4 = _mm_set1_epi16(1);
    for (int r = 0; r < R; ++r) {
      const BlockQ4_0& blk = reinterpret_cast<const BlockQ4_0*>(w + r * rb)[b];
      const __m128i q = load128(blk.qs);
      const __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
      const float d = half_to_float(blk.d);
      for (int c = 0; c < C; ++c) {
        const int8_t* xq = x[c].qpair + b * kQK;
        const __m128i p = _mm_sub_epi16(_mm_add_epi16(_mm_maddubs_epi16(lo, load128(xq)),
                                                      _mm_maddubs_epi16(hi, load128(xq + 16))),
                                        load128(x[c].quad8 + b * 8));
        const __m128 s = _mm_cvtepi32_ps(_mm_madd_epi16(p, ones4));
        acc[r][c] = _mm256_fmadd_ps(_mm256_insertf128_ps(_mm256_setzero_ps(), s, 0),
                                    _mm256_set1_ps(d * x[c].d[b]), acc[r][c]);
      }
    }
  }
  finish(acc, out);
}

// The 8 six-bit scales and mins of a Q4_K block as bytes: three
// little-endian words of the 12 scale bytes, four codes at a time
// (q4k_scales' rule).
inline void q4k_scale_bytes(const uint8_t* s, uint64_t& sc, uint64_t& m) {
  uint32_t u[3];
  std::memcpy(u, s, 12);
  const uint32_t sc_lo = u[0] & 0x3f3f3f3f, m_lo = u[1] & 0x3f3f3f3f;
  const uint32_t sc_hi = (u[2] & 0x0f0f0f0f) | ((u[0] >> 2) & 0x30303030);
  const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0f) | ((u[1] >> 2) & 0x30303030);
  sc = uint64_t(sc_lo) | uint64_t(sc_hi) << 32;
  m = uint64_t(m_lo) | uint64_t(m_hi) << 32;
}

// pshufb control broadcasting 16-bit element j of each lane to the lane.
inline __m256i word_broadcast(int j) {
  return _mm256_set1_epi16(int16_t((2 * j) | (2 * j + 1) << 8));
}

// Q4_K: per super-block and x row, sum_j sc_j (sum q x over sub-block j) in
// i32 (the scale applied by madd) times d dx, minus dmin dx sum_j m_j (sum
// of x over sub-block j, from x's sums of 16).
template <int R, int C>
void dot_q4_k(const uint8_t* w, size_t rb, const QuantRow* x, int64_t in, float* out,
              const uint8_t* pf) {
  constexpr size_t kStep = R * sizeof(BlockQ4_K);
  __m256 acc[R][C];
  zero(acc);
  const __m256i low4 = _mm256_set1_epi8(15);
  for (int64_t b = 0; b < in / kQKK; ++b) {
    prefetch_span(pf, size_t(b) * kStep, size_t(b + 1) * kStep);
    for (int r = 0; r < R; ++r) {
      const BlockQ4_K& blk = reinterpret_cast<const BlockQ4_K*>(w + r * rb)[b];
      uint64_t sc8, m8;
      q4k_scale_bytes(blk.scales, sc8, m8);
      const __m256i sc =
          _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc8))));
      const __m128i mb = _mm_cvtsi64_si128(int64_t(m8));
      const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mb, mb));  // m0 m0 m1 m1 ..
      __m256i sumi[C];
      for (int c = 0; c < C; ++c) sumi[c] = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k) {
        const __m256i q = load256(blk.qs + 32 * k);
        const __m256i lo = _mm256_and_si256(q, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
        const __m256i s_lo = _mm256_shuffle_epi8(sc, word_broadcast(2 * k));
        const __m256i s_hi = _mm256_shuffle_epi8(sc, word_broadcast(2 * k + 1));
        for (int c = 0; c < C; ++c) {
          const int8_t* xq = x[c].q + b * kQKK + 64 * k;
          const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load256(xq)), s_lo);
          const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load256(xq + 32)), s_hi);
          sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(plo, phi));
        }
      }
      const float d = half_to_float(blk.d), dmin = half_to_float(blk.dmin);
      for (int c = 0; c < C; ++c) {
        const float dx = x[c].d[b];
        const __m256i m = _mm256_madd_epi16(load256(x[c].sums + b * 16), mins);
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[c]), _mm256_set1_ps(d * dx), acc[r][c]);
        acc[r][c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(dmin * dx), acc[r][c]);
      }
    }
  }
  finish(acc, out);
}

// pshufb control for Q6_K's scales: bytes [j x 8, j + 1 x 8].
inline __m128i scale_pair(int j) {
  return _mm_set_epi64x(0x0101010101010101LL * (j + 1), 0x0101010101010101LL * j);
}

// Q6_K: q in [0, 64) from 4 low and 2 high bits; sum_j sc_j sum (q - 32) x
// = sum_j sc_j (sum q x) - 32 sum_j sc_j (sum of x over j), all in i32.
template <int R, int C>
void dot_q6_k(const uint8_t* w, size_t rb, const QuantRow* x, int64_t in, float* out,
              const uint8_t* pf) {
  constexpr size_t kStep = R * sizeof(BlockQ6_K);
  __m256 acc[R][C];
  zero(acc);
  const __m256i low4 = _mm256_set1_epi8(15), bits45 = _mm256_set1_epi8(0x30);
  for (int64_t b = 0; b < in / kQKK; ++b) {
    prefetch_span(pf, size_t(b) * kStep, size_t(b + 1) * kStep);
    for (int r = 0; r < R; ++r) {
      const BlockQ6_K& blk = reinterpret_cast<const BlockQ6_K*>(w + r * rb)[b];
      const __m128i sc8 = load128(blk.scales);
      const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
      __m256i sumi[C];
      for (int c = 0; c < C; ++c)
        sumi[c] = _mm256_sub_epi32(
            _mm256_setzero_si256(),
            _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(x[c].sums + b * 16)), 5));
      for (int h = 0; h < 2; ++h) {
        const __m256i ql0 = load256(blk.ql + 64 * h), ql1 = load256(blk.ql + 64 * h + 32);
        const __m256i qh = load256(blk.qh + 32 * h);
        const __m256i q[4] = {_mm256_or_si256(_mm256_and_si256(ql0, low4),
                                              _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45)),
                              _mm256_or_si256(_mm256_and_si256(ql1, low4),
                                              _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45)),
                              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                                              _mm256_and_si256(qh, bits45)),
                              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                              _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45))};
        for (int k = 0; k < 4; ++k) {
          // Values 32 k + l: l < 16 in the low lane (scale 2 k), the rest high (2 k + 1).
          const __m256i s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, scale_pair(8 * h + 2 * k)));
          for (int c = 0; c < C; ++c) {
            const __m256i p =
                _mm256_maddubs_epi16(q[k], load256(x[c].q + b * kQKK + 128 * h + 32 * k));
            sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p, s));
          }
        }
      }
      const float d = half_to_float(blk.d);
      for (int c = 0; c < C; ++c)
        acc[r][c] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[c]), _mm256_set1_ps(d * x[c].d[b]), acc[r][c]);
    }
  }
  finish(acc, out);
}

// W8A8: one scale per row on both sides, so the row is one integer sum,
// kept in i32 over chunks short enough not to overflow (16384 values:
// |sum| <= 16384 * 127 * 127 < 2^31), in f32 across chunks.
template <int R, int C>
void dot_w8a8(const uint8_t* w, size_t rb, const QuantRow* x, int64_t in, float* out,
              const uint8_t* pf) {
  constexpr int64_t kChunk = 16384;
  __m256 acc[R][C];
  zero(acc);
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t vec_end = in / 32 * 32;
  for (int64_t c0 = 0; c0 < vec_end; c0 += kChunk) {
    __m256i sumi[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) sumi[r][c] = _mm256_setzero_si256();
    for (int64_t i = c0; i < std::min(vec_end, c0 + kChunk); i += 32) {
      prefetch_span(pf, size_t(i) * R, size_t(i + 32) * R);
      for (int r = 0; r < R; ++r) {
        const __m256i q = load256(w + r * rb + i);
        for (int c = 0; c < C; ++c) {
          const __m256i p =
              _mm256_maddubs_epi16(load256(x[c].aq + i), _mm256_sign_epi8(q, load256(x[c].q + i)));
          sumi[r][c] = _mm256_add_epi32(sumi[r][c], _mm256_madd_epi16(p, ones));
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c)
        acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_cvtepi32_ps(sumi[r][c]));
  }
  for (int r = 0; r < R; ++r) {
    const int8_t* wr = reinterpret_cast<const int8_t*>(w + r * rb);
    for (int c = 0; c < C; ++c) {
      int32_t tail = 0;
      for (int64_t i = vec_end; i < in; ++i) tail += int32_t(wr[i]) * x[c].q[i];
      out[r * C + c] = (hsum(acc[r][c]) + float(tail)) * x[c].d[0];
    }
  }
}

// The halves [i, in) of one row dotted with x, in scalar f32.
template <typename H>
inline float half_tail(const uint8_t* wr, const float* x, int64_t i, int64_t in) {
  float s = 0;
  for (; i < in; ++i) {
    uint16_t h;
    std::memcpy(&h, wr + 2 * i, 2);
    s += load(H{h}) * x[i];
  }
  return s;
}

// W8A16: sum q x in f32, x as given (f32 rows xf[c]).
template <int R, int C>
void dot_w8a16(const uint8_t* w, size_t rb, const float* const* xf, int64_t in, float* out,
               const uint8_t* pf) {
  __m256 acc[R][C];
  zero(acc);
  int64_t i = 0;
  for (; i + 8 <= in; i += 8) {
    prefetch_span(pf, size_t(i) * R, size_t(i + 8) * R);
    for (int r = 0; r < R; ++r) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + r * rb + i));
      const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
      for (int c = 0; c < C; ++c)
        acc[r][c] = _mm256_fmadd_ps(q, _mm256_loadu_ps(xf[c] + i), acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const int8_t* wr = reinterpret_cast<const int8_t*>(w + r * rb);
    for (int c = 0; c < C; ++c) {
      float s = hsum(acc[r][c]);
      for (int64_t j = i; j < in; ++j) s += float(wr[j]) * xf[c][j];
      out[r * C + c] = s;
    }
  }
}

// F16 and BF16 (H): sum w x in f32, the halves widened 8 at a time (F16C for
// f16, a shift for bf16), x as given.
// One x row (batch 1) is bound by memory: rows of up to 4096 halves are then
// read one after another, each from start to end, as one stream per thread
// reads this machine's memory faster than R rows side by side. Longer rows,
// and several x rows, take R rows at once: R rows share each x load, and a
// long row's x (f32) no longer fits L1 beside the weights. No software
// prefetch for one x row: it slowed that loop (BENCHMARKS.md, f16 decode).
template <typename H>
inline float dot_half_row(const uint8_t* wr, const float* x, int64_t in) {
  constexpr int U = 4;  // accumulators: the FMAs' latency hidden
  __m256 acc[1][U];
  zero(acc);
  int64_t i = 0;
  for (; i + 8 * U <= in; i += 8 * U)
    for (int u = 0; u < U; ++u) {
      const int64_t k = i + 8 * u;
      const __m256 q = load8<H>(wr + 2 * k);
      acc[0][u] = _mm256_fmadd_ps(q, _mm256_loadu_ps(x + k), acc[0][u]);
    }
  for (; i + 8 <= in; i += 8) {
    const __m256 q = load8<H>(wr + 2 * i);
    acc[0][0] = _mm256_fmadd_ps(q, _mm256_loadu_ps(x + i), acc[0][0]);
  }
  const __m256 a =
      _mm256_add_ps(_mm256_add_ps(acc[0][0], acc[0][1]), _mm256_add_ps(acc[0][2], acc[0][3]));
  return hsum(a) + half_tail<H>(wr, x, i, in);
}

template <typename H, int R, int C>
void dot_half(const uint8_t* w, size_t rb, const float* const* xf, int64_t in, float* out,
              const uint8_t* pf) {
  if (C == 1 && in <= 4096) {
    for (int r = 0; r < R; ++r) out[r] = dot_half_row<H>(w + r * rb, xf[0], in);
    return;
  }
  __m256 acc[R][C];
  zero(acc);
  int64_t i = 0;
  for (; i + 8 <= in; i += 8) {
    if (C > 1) prefetch_span(pf, size_t(2 * i) * R, size_t(2 * i + 16) * R);
    for (int r = 0; r < R; ++r) {
      const __m256 q = load8<H>(w + r * rb + 2 * i);
      for (int c = 0; c < C; ++c)
        acc[r][c] = _mm256_fmadd_ps(q, _mm256_loadu_ps(xf[c] + i), acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      out[r * C + c] = hsum(acc[r][c]) + half_tail<H>(w + r * rb, xf[c], i, in);
}

}  // namespace nk::ops::NK_CPU_NS::quant_avx2
