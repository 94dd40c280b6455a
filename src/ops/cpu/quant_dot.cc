// Quantised weights on the CPU, part 3: the direct product for few rows of x
// (decode), y[N, out] = x[N, in] W^T + b, reading W's blocks as stored.
//
// Decode is bound by reading W once from memory, so the inner loops do
// integer work only: each x row is quantised once per call to 8-bit blocks
// (quant_blocks.h, QuantRow) and a weight block's dot with them is a sum of
// u8 x i8 products (maddubs, then madd to i32), scaled by the two blocks'
// scales in f32 and accumulated in f32. Four weight rows go together so that
// the x block loaded once serves four rows, and the four rows' blocks for all
// N x rows are read while they are in L1. W8A16 keeps x in f32 and sums
// int8 -> f32 products. Output rows are split over the thread pool; each y
// value is summed by one thread in a fixed order, so the result does not
// depend on the thread count.
//
// Without AVX2 the same loops run in plain C++ over the same integer sums;
// results agree with the AVX2 ones up to the order of the f32 sums.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/quant_blocks.h"

#if defined(__AVX2__) && defined(__FMA__)
#define NK_QUANT_AVX2 1
#include <immintrin.h>
#endif

namespace nk::ops::cpu {
namespace {

constexpr int kRowGroup = 4;  // weight rows sharing each x block load

// Groups to prefetch ahead: enough to be kPrefetchBytes ahead of the loads.
int64_t prefetch_groups(size_t group_bytes) {
  static const size_t ahead = [] {
    const char* e = std::getenv("NK_QUANT_PF");
    return e ? size_t(std::atoll(e)) : size_t(4096);
  }();
  return std::max<int64_t>(1, int64_t((ahead + group_bytes - 1) / group_bytes));
}

// Scratch: x rows in f32 (bf16 x) and quantised. Like the other kernels'
// scratch buffers these assume one caller thread at a time.
std::vector<char> g_xf, g_xq;

// ---- quantising x ----

enum class XKind { None, Blocks32, Blocks256, Row };

XKind x_kind(QuantType t) {
  switch (t) {
    case QuantType::Q8_0:
    case QuantType::Q4_0:
      return XKind::Blocks32;
    case QuantType::Q4_K:
    case QuantType::Q6_K:
      return XKind::Blocks256;
    case QuantType::W8A8:
      return XKind::Row;
    case QuantType::W8A16:
      break;
  }
  return XKind::None;
}

// Bytes of one quantised x row, each array 64-byte aligned.
size_t round64(size_t n) {
  return (n + 63) & ~size_t(63);
}
size_t xrow_bytes(int64_t in, int64_t blocks) {
  const size_t n = size_t(in);
  return 3 * round64(n) + round64(n / 4 * 2) + round64(n / 16 * 2) +
         round64(size_t(blocks) * sizeof(float));
}
QuantRow xrow_at(char* base, int64_t in, int64_t blocks) {
  const size_t n = size_t(in);
  QuantRow r;
  r.q = reinterpret_cast<int8_t*>(base);
  r.aq = reinterpret_cast<uint8_t*>(base + round64(n));
  r.qpair = reinterpret_cast<int8_t*>(base + 2 * round64(n));
  r.quad8 = reinterpret_cast<int16_t*>(base + 3 * round64(n));
  r.sums = reinterpret_cast<int16_t*>(base + 3 * round64(n) + round64(n / 4 * 2));
  r.d = reinterpret_cast<float*>(base + 3 * round64(n) + round64(n / 4 * 2) + round64(n / 16 * 2));
  return r;
}

// q[0, n) = nearest-even rounding of x / d, d = max|x| / 127 (0: q = 0).
// The AVX2 path computes the same f32 quotients, so both agree bit for bit.
float quantize_block(const float* x, int64_t n, int8_t* q) {
  float amax = 0.f;
  int64_t i = 0;
#ifdef NK_QUANT_AVX2
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  for (float v : lanes) amax = std::max(amax, v);
#endif
  for (; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.f;
  if (d == 0.f) {
    std::memset(q, 0, size_t(n));
    return 0.f;
  }
  i = 0;
#ifdef NK_QUANT_AVX2
  const __m256 vd = _mm256_set1_ps(d);
  for (; i + 8 <= n; i += 8) {
    const __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), vd),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(_mm256_cvtps_epi32(r)),
                                      _mm256_extracti128_si256(_mm256_cvtps_epi32(r), 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), _mm_packs_epi16(w, w));
  }
#endif
  for (; i < n; ++i) q[i] = int8_t(std::clamp(std::nearbyint(x[i] / d), -127.f, 127.f));
  return d;
}

// Q4_0's views of q: qpair and quad8 (QuantRow). A last unpaired block keeps
// its order (lo, hi).
void q4_0_x_layout(const QuantRow& r, int64_t in) {
  const int64_t nb = in / kQK;
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* q = r.q + b * kQK;
    const bool paired = (b | 1) < nb;
    int8_t* lo = r.qpair + (b & ~int64_t(1)) * kQK + (paired ? (b & 1) * 16 : 0);
    int8_t* hi = lo + (paired ? 32 : 16);
    for (int j = 0; j < 16; ++j) {
      lo[j] = q[j];
      hi[j] = q[16 + j];
    }
    for (int i = 0; i < 8; ++i)
      r.quad8[b * 8 + i] = int16_t(8 * (q[2 * i] + q[2 * i + 1] + q[16 + 2 * i] + q[17 + 2 * i]));
  }
}

// One x row (f32) into r for weights of type t.
void quantize_x_row(QuantType t, const float* x, int64_t in, const QuantRow& r) {
  const XKind k = x_kind(t);
  const int64_t block = k == XKind::Blocks32 ? kQK : k == XKind::Blocks256 ? kQKK : in;
  for (int64_t b = 0; b < in / block; ++b)
    r.d[b] = quantize_block(x + b * block, block, r.q + b * block);
  if (t == QuantType::Q8_0 || t == QuantType::W8A8)
    for (int64_t i = 0; i < in; ++i) r.aq[i] = uint8_t(std::abs(int(r.q[i])));
  if (t == QuantType::Q4_0) q4_0_x_layout(r, in);
  if (k == XKind::Blocks256)
    for (int64_t g = 0; g < in / 16; ++g) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += r.q[16 * g + i];
      r.sums[g] = int16_t(s);
    }
}

// ---- one weight row's blocks against one x row: R rows at a time ----
// Each kernel writes out[r] = sum over the row of w x (before the W8 row
// scale), for rows w, w + rb, ..., w + (R - 1) rb.

#ifdef NK_QUANT_AVX2

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

__m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// Prefetches the lines of pf + [lo, hi): a later row group's bytes, spread
// over the iterations of the current one. Rows are short (a 2048-value Q4_0
// row is 1152 bytes) and hardware prefetchers stop at 4 KiB pages, so
// without this decode waits on memory at every page.
inline void prefetch_span(const uint8_t* pf, size_t lo, size_t hi) {
  if (!pf) return;
  for (size_t off = lo & ~size_t(63); off < hi; off += 64)
    _mm_prefetch(reinterpret_cast<const char*>(pf + off), _MM_HINT_T0);
}

template <int R>
void dot_q8_0(const uint8_t* w, size_t rb, const QuantRow& x, int64_t in, float* out,
              const uint8_t* pf) {
  constexpr size_t kStep = R * sizeof(BlockQ8_0);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < in / kQK; ++b) {
    prefetch_span(pf, size_t(b) * kStep, size_t(b + 1) * kStep);
    const __m256i xq = load256(x.q + b * kQK), xa = load256(x.aq + b * kQK);
    const float dx = x.d[b];
    for (int r = 0; r < R; ++r) {
      const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(w + r * rb)[b];
      // |x| (u8) times w sign(x): sum x w without an i8 x i8 product.
      const __m256i p = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(load256(blk.qs), xq));
      const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
      acc[r] = _mm256_fmadd_ps(s, _mm256_set1_ps(half_to_float(blk.d) * dx), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

// Q4_0 two blocks a step: both blocks' 16 bytes in one register, so one
// mask and shift give values j < 16 of both (low nibbles) and j >= 16 (high
// nibbles), matched by x's qpair; one madd, conversion and FMA serve both,
// with scales [d0 x4 | d1 x4].
template <int R>
void dot_q4_0(const uint8_t* w, size_t rb, const QuantRow& x, int64_t in, float* out,
              const uint8_t* pf) {
  constexpr size_t kStep = R * sizeof(BlockQ4_0);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(15);
  const __m256i halves = _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0);
  const int64_t nb = in / kQK;
  for (int64_t b = 0; b + 1 < nb; b += 2) {
    prefetch_span(pf, size_t(b) * kStep, size_t(b + 2) * kStep);
    const __m256i xlo = load256(x.qpair + b * kQK), xhi = load256(x.qpair + b * kQK + 32);
    const __m256i off = load256(x.quad8 + b * 8);
    const __m128 dx = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x.d + b)));
    for (int r = 0; r < R; ++r) {
      const BlockQ4_0* blk = reinterpret_cast<const BlockQ4_0*>(w + r * rb) + b;
      const __m256i q = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[1].qs)),
                                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[0].qs)));
      const __m256i lo = _mm256_and_si256(q, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      // sum (q - 8) x = sum q x - 8 sum x, the second from x's quad8.
      const __m256i p = _mm256_sub_epi16(
          _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi)), off);
      const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
      const __m128i dh = _mm_insert_epi16(_mm_cvtsi32_si128(blk[0].d), blk[1].d, 1);
      const __m128 d = _mm_mul_ps(_mm_cvtph_ps(dh), dx);
      acc[r] = _mm256_fmadd_ps(s, _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d), halves),
                               acc[r]);
    }
  }
  if (nb & 1) {  // a last unpaired block: in 128-bit halves
    const int64_t b = nb - 1;
    const __m128i m4 = _mm_set1_epi8(15);
    const __m128i xlo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.qpair + b * kQK));
    const __m128i xhi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.qpair + b * kQK + 16));
    const __m128i off = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.quad8 + b * 8));
    for (int r = 0; r < R; ++r) {
      const BlockQ4_0& blk = reinterpret_cast<const BlockQ4_0*>(w + r * rb)[b];
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
      const __m128i p = _mm_sub_epi16(
          _mm_add_epi16(_mm_maddubs_epi16(_mm_and_si128(q, m4), xlo),
                        _mm_maddubs_epi16(_mm_and_si128(_mm_srli_epi16(q, 4), m4), xhi)),
          off);
      const __m128 s = _mm_cvtepi32_ps(_mm_madd_epi16(p, _mm_set1_epi16(1)));
      const __m256 s8 = _mm256_insertf128_ps(_mm256_setzero_ps(), s, 0);
      acc[r] = _mm256_fmadd_ps(s8, _mm256_set1_ps(half_to_float(blk.d) * x.d[b]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

// The 8 six-bit scales and mins of a Q4_K block as bytes: three little-endian
// words of the 12 scale bytes, unpacked four at a time (q4k_scales' rule).
void q4k_scale_bytes(const uint8_t* s, uint64_t& sc, uint64_t& m) {
  uint32_t u[3];
  std::memcpy(u, s, 12);
  const uint32_t sc_lo = u[0] & 0x3f3f3f3f, m_lo = u[1] & 0x3f3f3f3f;
  const uint32_t sc_hi = (u[2] & 0x0f0f0f0f) | ((u[0] >> 2) & 0x30303030);
  const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0f) | ((u[1] >> 2) & 0x30303030);
  sc = uint64_t(sc_lo) | uint64_t(sc_hi) << 32;
  m = uint64_t(m_lo) | uint64_t(m_hi) << 32;
}

// pshufb controls broadcasting 16-bit element j of a lane to the whole lane.
__m256i word_broadcast(int j) {
  return _mm256_set1_epi16(int16_t((2 * j) | (2 * j + 1) << 8));
}

template <int R>
void dot_q4_k(const uint8_t* w, size_t rb, const QuantRow& x, int64_t in, float* out,
              const uint8_t* pf) {
  constexpr size_t kStep = R * sizeof(BlockQ4_K);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(15);
  __m256i pick[8];
  for (int j = 0; j < 8; ++j) pick[j] = word_broadcast(j);
  for (int64_t b = 0; b < in / kQKK; ++b) {
    prefetch_span(pf, size_t(b) * kStep, size_t(b + 1) * kStep);
    const int8_t* xq = x.q + b * kQKK;
    const __m256i sums = load256(x.sums + b * 16);
    const float dx = x.d[b];
    for (int r = 0; r < R; ++r) {
      const BlockQ4_K& blk = reinterpret_cast<const BlockQ4_K*>(w + r * rb)[b];
      uint64_t sc8, m8;
      q4k_scale_bytes(blk.scales, sc8, m8);
      const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc8))));
      // mins: sum_j m_j (sum of x over sub-block j), from x's sums of 16.
      const __m128i mb = _mm_cvtsi64_si128(int64_t(m8));
      const __m256i mins = _mm256_madd_epi16(sums, _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mb, mb)));
      __m256i sumi = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i q = load256(blk.qs + 32 * c);
        const __m256i lo = _mm256_and_si256(q, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
        const __m256i plo = _mm256_maddubs_epi16(lo, load256(xq + 64 * c));
        const __m256i phi = _mm256_maddubs_epi16(hi, load256(xq + 64 * c + 32));
        sumi = _mm256_add_epi32(sumi,
                                _mm256_madd_epi16(plo, _mm256_shuffle_epi8(sc, pick[2 * c])));
        sumi = _mm256_add_epi32(sumi,
                                _mm256_madd_epi16(phi, _mm256_shuffle_epi8(sc, pick[2 * c + 1])));
      }
      const float d = half_to_float(blk.d) * dx, dmin = half_to_float(blk.dmin) * dx;
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc[r]);
      acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_set1_ps(dmin), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

// pshufb controls for Q6_K's scales: bytes [j x 8, j + 1 x 8].
__m128i scale_pair(int j) {
  return _mm_set_epi64x(0x0101010101010101LL * (j + 1), 0x0101010101010101LL * j);
}

template <int R>
void dot_q6_k(const uint8_t* w, size_t rb, const QuantRow& x, int64_t in, float* out,
              const uint8_t* pf) {
  constexpr size_t kStep = R * sizeof(BlockQ6_K);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(15), bits45 = _mm256_set1_epi8(0x30);
  __m128i pair[8];
  for (int j = 0; j < 8; ++j) pair[j] = scale_pair(2 * j);
  for (int64_t b = 0; b < in / kQKK; ++b) {
    prefetch_span(pf, size_t(b) * kStep, size_t(b + 1) * kStep);
    const int8_t* xq = x.q + b * kQKK;
    const __m256i sums = load256(x.sums + b * 16);
    const float dx = x.d[b];
    for (int r = 0; r < R; ++r) {
      const BlockQ6_K& blk = reinterpret_cast<const BlockQ6_K*>(w + r * rb)[b];
      const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales));
      // sum_j sc_j sum_i (q - 32) x = sum_j sc_j (sum_i q x) - 32 sum_j sc_j (sum of x over j).
      __m256i sumi = _mm256_sub_epi32(
          _mm256_setzero_si256(),
          _mm256_slli_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), sums), 5));
      for (int h = 0; h < 2; ++h) {
        const __m256i ql0 = load256(blk.ql + 64 * h), ql1 = load256(blk.ql + 64 * h + 32);
        const __m256i qh = load256(blk.qh + 32 * h);
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(ql0, low4),
                            _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45)),
            _mm256_or_si256(_mm256_and_si256(ql1, low4),
                            _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                            _mm256_and_si256(qh, bits45)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45))};
        for (int k = 0; k < 4; ++k) {
          // Values 32 k + l: l < 16 in the low lane (scale 2 k), the rest high (2 k + 1).
          const __m256i p = _mm256_maddubs_epi16(q[k], load256(xq + 128 * h + 32 * k));
          const __m256i s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pair[4 * h + k]));
          sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
        }
      }
      const float d = half_to_float(blk.d) * dx;
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

// W8A8: one scale per row on both sides, so the whole row is an integer sum,
// kept in i32 over chunks short enough not to overflow (16384 values:
// |sum| <= 16384 * 127 * 127 < 2^31), and in f32 across chunks.
template <int R>
void dot_w8a8(const uint8_t* w, size_t rb, const QuantRow& x, int64_t in, float* out,
              const uint8_t* pf) {
  constexpr int64_t kChunk = 16384;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t vec_end = in / 32 * 32;
  for (int64_t c0 = 0; c0 < vec_end; c0 += kChunk) {
    __m256i sumi[R];
    for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
    for (int64_t i = c0; i < std::min(vec_end, c0 + kChunk); i += 32) {
      prefetch_span(pf, size_t(i) * R, size_t(i + 32) * R);
      const __m256i xq = load256(x.q + i), xa = load256(x.aq + i);
      for (int r = 0; r < R; ++r) {
        const __m256i p = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(load256(w + r * rb + i), xq));
        sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p, ones));
      }
    }
    for (int r = 0; r < R; ++r) acc[r] = _mm256_add_ps(acc[r], _mm256_cvtepi32_ps(sumi[r]));
  }
  for (int r = 0; r < R; ++r) {
    int32_t tail = 0;
    const int8_t* wr = reinterpret_cast<const int8_t*>(w + r * rb);
    for (int64_t i = vec_end; i < in; ++i) tail += int32_t(wr[i]) * x.q[i];
    out[r] = (hsum(acc[r]) + float(tail)) * x.d[0];
  }
}

// W8A16: sum q x in f32, x as given (converted to f32).
template <int R>
void dot_w8a16(const uint8_t* w, size_t rb, const float* x, int64_t in, float* out,
               const uint8_t* pf) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= in; i += 8) {
    prefetch_span(pf, size_t(i) * R, size_t(i + 8) * R);
    const __m256 xv = _mm256_loadu_ps(x + i);
    for (int r = 0; r < R; ++r) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + r * rb + i));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), xv, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum(acc[r]);
    const int8_t* wr = reinterpret_cast<const int8_t*>(w + r * rb);
    for (int64_t j = i; j < in; ++j) s += float(wr[j]) * x[j];
    out[r] = s;
  }
}

#else  // plain C++: the same integer sums per block, f32 across blocks

template <int R>
void dot_q8_0(const uint8_t* w, size_t rb, const QuantRow& x, int64_t in, float* out,
              const uint8_t* pf) {
  for (int r = 0; r < R; ++r) {
    const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(w + r * rb);
    float acc = 0.f;
    for (int64_t b = 0; b < in / kQK; ++b) {
      int32_t s = 0;
      for (int j = 0; j < kQK; ++j) s += int32_t(blk[b].qs[j]) * x.q[b * kQK + j];
      acc += float(s) * (half_to_float(blk[b].d) * x.d[b]);
    }
    out[r] = acc;
  }
}

template <int R>
void dot_q4_0(const uint8_t* w, size_t rb, const QuantRow& x, int64_t in, float* out,
              const uint8_t* pf) {
  for (int r = 0; r < R; ++r) {
    const BlockQ4_0* blk = reinterpret_cast<const BlockQ4_0*>(w + r * rb);
    float acc = 0.f;
    for (int64_t b = 0; b < in / kQK; ++b) {
      const int8_t* xq = x.q + b * kQK;
      int32_t s = 0;
      for (int j = 0; j < kQK / 2; ++j)
        s += ((blk[b].qs[j] & 15) - 8) * xq[j] + ((blk[b].qs[j] >> 4) - 8) * xq[j + kQK / 2];
      acc += float(s) * (half_to_float(blk[b].d) * x.d[b]);
    }
    out[r] = acc;
  }
}

template <int R>
void dot_q4_k(const uint8_t* w, size_t rb, const QuantRow& x, int64_t in, float* out,
              const uint8_t* pf) {
  for (int r = 0; r < R; ++r) {
    const BlockQ4_K* blk = reinterpret_cast<const BlockQ4_K*>(w + r * rb);
    float acc = 0.f;
    for (int64_t b = 0; b < in / kQKK; ++b) {
      const Q4KScales s = q4k_scales(blk[b].scales);
      const int8_t* xq = x.q + b * kQKK;
      const int16_t* sums = x.sums + b * 16;
      int32_t sumi = 0, mins = 0;
      for (int c = 0; c < 4; ++c) {
        int32_t lo = 0, hi = 0;
        for (int i = 0; i < 32; ++i) {
          lo += (blk[b].qs[32 * c + i] & 15) * xq[64 * c + i];
          hi += (blk[b].qs[32 * c + i] >> 4) * xq[64 * c + 32 + i];
        }
        sumi += lo * s.sc[2 * c] + hi * s.sc[2 * c + 1];
      }
      for (int j = 0; j < 8; ++j) mins += s.m[j] * (sums[2 * j] + sums[2 * j + 1]);
      const float d = half_to_float(blk[b].d) * x.d[b], dmin = half_to_float(blk[b].dmin) * x.d[b];
      acc += float(sumi) * d - float(mins) * dmin;
    }
    out[r] = acc;
  }
}

template <int R>
void dot_q6_k(const uint8_t* w, size_t rb, const QuantRow& x, int64_t in, float* out,
              const uint8_t* pf) {
  for (int r = 0; r < R; ++r) {
    const BlockQ6_K* blk = reinterpret_cast<const BlockQ6_K*>(w + r * rb);
    float acc = 0.f;
    for (int64_t b = 0; b < in / kQKK; ++b) {
      const int8_t* xq = x.q + b * kQKK;
      int32_t sumi = 0;
      for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 4; ++k)
          for (int half = 0; half < 2; ++half) {
            int32_t s = 0;
            for (int l = 16 * half; l < 16 * half + 16; ++l) {
              const int lo = (blk[b].ql[64 * h + l + 32 * (k & 1)] >> (k < 2 ? 0 : 4)) & 15;
              const int q = lo | ((blk[b].qh[32 * h + l] >> (2 * k)) & 3) << 4;
              s += (q - 32) * xq[128 * h + 32 * k + l];
            }
            sumi += s * blk[b].scales[8 * h + 2 * k + half];
          }
      acc += float(sumi) * (half_to_float(blk[b].d) * x.d[b]);
    }
    out[r] = acc;
  }
}

template <int R>
void dot_w8a8(const uint8_t* w, size_t rb, const QuantRow& x, int64_t in, float* out,
              const uint8_t* pf) {
  constexpr int64_t kChunk = 16384;
  for (int r = 0; r < R; ++r) {
    const int8_t* wr = reinterpret_cast<const int8_t*>(w + r * rb);
    float acc = 0.f;
    for (int64_t c0 = 0; c0 < in; c0 += kChunk) {
      int32_t s = 0;
      for (int64_t i = c0; i < std::min(in, c0 + kChunk); ++i) s += int32_t(wr[i]) * x.q[i];
      acc += float(s);
    }
    out[r] = acc * x.d[0];
  }
}

template <int R>
void dot_w8a16(const uint8_t* w, size_t rb, const float* x, int64_t in, float* out,
               const uint8_t* pf) {
  for (int r = 0; r < R; ++r) {
    const int8_t* wr = reinterpret_cast<const int8_t*>(w + r * rb);
    float s = 0.f;
    for (int64_t i = 0; i < in; ++i) s += float(wr[i]) * x[i];
    out[r] = s;
  }
}

#endif

// The dot of R weight rows starting at w with x row n (quantised xq or f32 xf).
template <int R>
void dot_rows(QuantType t, const uint8_t* w, size_t rb, const QuantRow& xq, const float* xf,
              int64_t in, float* out, const uint8_t* pf) {
  switch (t) {
    case QuantType::Q8_0:
      return dot_q8_0<R>(w, rb, xq, in, out, pf);
    case QuantType::Q4_0:
      return dot_q4_0<R>(w, rb, xq, in, out, pf);
    case QuantType::Q4_K:
      return dot_q4_k<R>(w, rb, xq, in, out, pf);
    case QuantType::Q6_K:
      return dot_q6_k<R>(w, rb, xq, in, out, pf);
    case QuantType::W8A8:
      return dot_w8a8<R>(w, rb, xq, in, out, pf);
    case QuantType::W8A16:
      return dot_w8a16<R>(w, rb, xf, in, out, pf);
  }
}

// x as f32 rows: x itself, or its bf16 rows widened into g_xf.
const float* x_as_f32(const Tensor& x) {
  if (x.dtype() == DType::F32) return x.data<float>();
  const int64_t n = x.numel();
  float* out = scratch<float>(g_xf, size_t(n));
  const bf16* src = x.data<bf16>();
  for (int64_t i = 0; i < n; ++i) out[i] = load(src[i]);
  return out;
}

template <typename T>
void direct(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b) {
  const QuantType t = w.type;
  const int64_t N = rows_of(x), in = w.cols(), out = w.rows();
  const float* xf = x_as_f32(x);
  const XKind kind = x_kind(t);
  const int64_t blocks = kind == XKind::Blocks32 ? in / kQK : kind == XKind::Blocks256 ? in / kQKK : 1;
  const size_t xrb = xrow_bytes(in, blocks);
  char* xbase = kind == XKind::None ? nullptr : scratch<char>(g_xq, size_t(N) * xrb);
  for (int64_t n = 0; n < N && xbase; ++n)
    quantize_x_row(t, xf + n * in, in, xrow_at(xbase + n * xrb, in, blocks));

  const uint8_t* wdata = w.data.data<uint8_t>();
  const size_t rb = w.row_bytes();
  const float* wscale = w.scale.defined() ? w.scale.data<float>() : nullptr;
  const bool bias_f32 = b.defined() && b.dtype() == DType::F32;
  const float* bf = bias_f32 ? b.data<float>() : nullptr;
  const T* bt = b.defined() && !bias_f32 ? b.data<T>() : nullptr;
  T* yd = y.data<T>();
  auto finish = [&](int64_t n, int64_t o, float v) {
    if (wscale) v *= wscale[o];
    if (bf) v += bf[o];
    if (bt) v += load(bt[o]);
    yd[n * out + o] = store<T>(v);
  };
  const int64_t groups = (out + kRowGroup - 1) / kRowGroup;
  // Prefetch a group this many groups ahead (at least ~kPrefetchBytes ahead).
  const int64_t ahead = prefetch_groups(kRowGroup * rb);
  // ~64 KiB of weights per task at least: a call's threads are woken once.
  const int64_t grain = std::max<int64_t>(1, int64_t(65536 / (kRowGroup * rb)));
  parallel_for(groups, grain, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t o0 = g * kRowGroup, rows = std::min<int64_t>(kRowGroup, out - o0);
      const uint8_t* wr = wdata + size_t(o0) * rb;
      // The first x row reads the group from memory: it prefetches a later
      // group (one the same thread will reach, when it is not past the end).
      const uint8_t* pf = g + ahead < groups ? wr + ahead * kRowGroup * rb : nullptr;
      for (int64_t n = 0; n < N; ++n) {
        const QuantRow xq = xbase ? xrow_at(xbase + n * xrb, in, blocks) : QuantRow{};
        float v[kRowGroup];
        if (rows == kRowGroup) {
          dot_rows<kRowGroup>(t, wr, rb, xq, xf + n * in, in, v, n == 0 ? pf : nullptr);
        } else {
          for (int64_t r = 0; r < rows; ++r)
            dot_rows<1>(t, wr + r * rb, rb, xq, xf + n * in, in, v + r, nullptr);
        }
        for (int64_t r = 0; r < rows; ++r) finish(n, o0 + r, v[r]);
      }
    }
  });
}

}  // namespace

void quant_linear_direct(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b) {
  if (x.dtype() == DType::F32)
    direct<float>(y, x, w, b);
  else
    direct<bf16>(y, x, w, b);
}

}  // namespace nk::ops::cpu
