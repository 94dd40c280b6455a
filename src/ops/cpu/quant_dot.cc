// Quantised weights on the CPU, part 3: the direct product for few rows of x
// (decode), y[N, out] = x[N, in] W^T + b, reading W's blocks as stored.
//
// Decode is bound by reading W once from memory, so the inner loops do
// integer work only: each x row is quantised once per call to 8-bit blocks
// (quant_blocks.h, QuantRow) and a weight block's dot with them is a sum of
// u8 x i8 products (maddubs, then madd to i32), scaled by the two blocks'
// scales in f32 and accumulated in f32 (quant_dot_avx2.h). Four weight rows
// go together, so an x block loaded once serves four rows, and each group
// of four rows meets two or four x rows per pass, so a weight block is
// unpacked once for them; the group's bytes stay in L1 for the rest of x.
// While the first pass reads a group from memory it prefetches the next
// one. W8A16 keeps x in f32 and sums int8 -> f32 products. Output rows are
// split over the thread pool; each y value is summed by one thread in a
// fixed order, so the result does not depend on the thread count.
//
// Without AVX2 the same sums run in plain C++ over the same integers;
// results agree with the AVX2 ones up to the order of the f32 sums.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/level.h"
#include "ops/cpu/quant_blocks.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define NK_QUANT_AVX2 1
#include "ops/cpu/quant_dot_avx2.h"
#endif

namespace nk::ops::NK_CPU_NS {

// quantize_x_block (quant_blocks.h). The AVX2 path computes the same f32
// quotients as the plain one, so both agree bit for bit.
float quantize_x_block(const float* x, int64_t n, int8_t* q) {
  float amax = 0.f, nonfinite = 0.f;  // nonfinite: sum of x * 0, NaN iff some x is not finite
  int64_t i = 0;
#ifdef NK_QUANT_AVX2
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps(), vbad = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    vmax = _mm256_max_ps(vmax, _mm256_and_ps(v, abs_mask));
    vbad = _mm256_add_ps(vbad, _mm256_mul_ps(v, _mm256_setzero_ps()));
  }
  alignas(32) float lanes[8], bad[8];
  _mm256_store_ps(lanes, vmax);
  _mm256_store_ps(bad, vbad);
  for (int k = 0; k < 8; ++k) {
    amax = std::max(amax, lanes[k]);
    nonfinite += bad[k];
  }
#endif
  for (; i < n; ++i) {
    amax = std::max(amax, std::fabs(x[i]));
    nonfinite += x[i] * 0.f;
  }
  const float d = nonfinite == 0.f ? amax / 127.f : std::numeric_limits<float>::quiet_NaN();
  if (!(d > 0.f)) {
    std::memset(q, 0, size_t(n));
    return d;
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

namespace {

constexpr int kRowGroup = 4;  // weight rows sharing each x block load
// x rows sharing each unpacked weight block: the K types' blocks cost more
// to unpack (scales, 6-bit values) and keep fewer live registers per x row
// (bench_quant --sweep: 4 x rows were 10-20% faster than 2 at N = 4 and 8
// for them, slower for W8A16, the same for the rest); F16's halves are
// widened once for 4 x rows (20% faster at N = 16 on an AVX-512 host,
// where F16 takes this kernel up to 32 rows). Fewer rows left than that
// go 2 and then 1 at a time.
constexpr int kXRows = 4;
int x_rows_per_pass(QuantType t) {
  return t == QuantType::Q4_K || t == QuantType::Q6_K || t == QuantType::F16 || t == QuantType::BF16
             ? 4
             : 2;
}

// Row groups to prefetch ahead: the next one, or enough to be 4 KiB ahead
// (1 group and 4 KiB timed the same, and 16 KiB slower, bench_quant cold).
int64_t prefetch_groups(size_t group_bytes) {
  constexpr size_t kAheadBytes = 4096;
  return std::max<int64_t>(1, int64_t((kAheadBytes + group_bytes - 1) / group_bytes));
}

// Scratch: x rows in f32 (bf16 x) and quantised. Like the other kernels'
// scratch buffers these assume one caller thread at a time.
std::vector<char> g_dot_xf, g_dot_xq;

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
    case QuantType::F16:
    case QuantType::BF16:
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
    r.d[b] = quantize_x_block(x + b * block, block, r.q + b * block);
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

// ---- R weight rows against C x rows ----
// Each kernel writes out[r * C + c] = sum over weight row r of w x_c (before
// a W8 row scale), rows at w, w + rb, ..., w + (R - 1) rb.

#ifdef NK_QUANT_AVX2
using namespace quant_avx2;
#else  // plain C++: the same integer sums per block, f32 across blocks

float dot1_q8_0(const BlockQ8_0* blk, const QuantRow& x, int64_t in) {
  float acc = 0.f;
  for (int64_t b = 0; b < in / kQK; ++b) {
    int32_t s = 0;
    for (int j = 0; j < kQK; ++j) s += int32_t(blk[b].qs[j]) * x.q[b * kQK + j];
    acc += float(s) * (half_to_float(blk[b].d) * x.d[b]);
  }
  return acc;
}

float dot1_q4_0(const BlockQ4_0* blk, const QuantRow& x, int64_t in) {
  float acc = 0.f;
  for (int64_t b = 0; b < in / kQK; ++b) {
    const int8_t* xq = x.q + b * kQK;
    int32_t s = 0;
    for (int j = 0; j < kQK / 2; ++j)
      s += ((blk[b].qs[j] & 15) - 8) * xq[j] + ((blk[b].qs[j] >> 4) - 8) * xq[j + kQK / 2];
    acc += float(s) * (half_to_float(blk[b].d) * x.d[b]);
  }
  return acc;
}

float dot1_q4_k(const BlockQ4_K* blk, const QuantRow& x, int64_t in) {
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
  return acc;
}

float dot1_q6_k(const BlockQ6_K* blk, const QuantRow& x, int64_t in) {
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
  return acc;
}

// i32 over chunks of 16384 values (no overflow), f32 across them.
float dot1_w8a8(const int8_t* w, const QuantRow& x, int64_t in) {
  constexpr int64_t kChunk = 16384;
  float acc = 0.f;
  for (int64_t c0 = 0; c0 < in; c0 += kChunk) {
    int32_t s = 0;
    for (int64_t i = c0; i < std::min(in, c0 + kChunk); ++i) s += int32_t(w[i]) * x.q[i];
    acc += float(s);
  }
  return acc * x.d[0];
}

float dot1_w8a16(const int8_t* w, const float* x, int64_t in) {
  float s = 0.f;
  for (int64_t i = 0; i < in; ++i) s += float(w[i]) * x[i];
  return s;
}

template <int R, int C, typename Block>
void each_pair(float (*dot1)(const Block*, const QuantRow&, int64_t), const uint8_t* w, size_t rb,
               const QuantRow* x, int64_t in, float* out) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      out[r * C + c] = dot1(reinterpret_cast<const Block*>(w + r * rb), x[c], in);
}

template <int R, int C>
void dot_q8_0(const uint8_t* w, size_t rb, const QuantRow* x, int64_t in, float* out,
              const uint8_t*) {
  each_pair<R, C>(dot1_q8_0, w, rb, x, in, out);
}
template <int R, int C>
void dot_q4_0(const uint8_t* w, size_t rb, const QuantRow* x, int64_t in, float* out,
              const uint8_t*) {
  each_pair<R, C>(dot1_q4_0, w, rb, x, in, out);
}
template <int R, int C>
void dot_q4_k(const uint8_t* w, size_t rb, const QuantRow* x, int64_t in, float* out,
              const uint8_t*) {
  each_pair<R, C>(dot1_q4_k, w, rb, x, in, out);
}
template <int R, int C>
void dot_q6_k(const uint8_t* w, size_t rb, const QuantRow* x, int64_t in, float* out,
              const uint8_t*) {
  each_pair<R, C>(dot1_q6_k, w, rb, x, in, out);
}
template <int R, int C>
void dot_w8a8(const uint8_t* w, size_t rb, const QuantRow* x, int64_t in, float* out,
              const uint8_t*) {
  each_pair<R, C>(dot1_w8a8, w, rb, x, in, out);
}
template <int R, int C>
void dot_w8a16(const uint8_t* w, size_t rb, const float* const* xf, int64_t in, float* out,
               const uint8_t*) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      out[r * C + c] = dot1_w8a16(reinterpret_cast<const int8_t*>(w + r * rb), xf[c], in);
}
// F16 and BF16 (H): sum w x in f32 over the halves widened.
template <typename H, int R, int C>
void dot_half(const uint8_t* w, size_t rb, const float* const* xf, int64_t in, float* out,
              const uint8_t*) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = 0;
      for (int64_t i = 0; i < in; ++i) {
        uint16_t h;
        std::memcpy(&h, w + r * rb + 2 * i, 2);
        s += load(H{h}) * xf[c][i];
      }
      out[r * C + c] = s;
    }
}

#endif

// R weight rows from w against C x rows (quantised xq or f32 xf) into out[r * C + c].
template <int R, int C>
void dot_rows(QuantType t, const uint8_t* w, size_t rb, const QuantRow* xq, const float* const* xf,
              int64_t in, float* out, const uint8_t* pf) {
  switch (t) {
    case QuantType::Q8_0:
      return dot_q8_0<R, C>(w, rb, xq, in, out, pf);
    case QuantType::Q4_0:
      return dot_q4_0<R, C>(w, rb, xq, in, out, pf);
    case QuantType::Q4_K:
      return dot_q4_k<R, C>(w, rb, xq, in, out, pf);
    case QuantType::Q6_K:
      return dot_q6_k<R, C>(w, rb, xq, in, out, pf);
    case QuantType::W8A8:
      return dot_w8a8<R, C>(w, rb, xq, in, out, pf);
    case QuantType::W8A16:
      return dot_w8a16<R, C>(w, rb, xf, in, out, pf);
    case QuantType::F16:
      return dot_half<f16, R, C>(w, rb, xf, in, out, pf);
    case QuantType::BF16:
      return dot_half<bf16, R, C>(w, rb, xf, in, out, pf);
  }
}

// One call's work: y's rows [o0, o0 + 4) of every x row per row group.
template <typename T>
struct Direct {
  explicit Direct(QuantOut<T> o) : y(o) {}
  QuantType t;
  int64_t N, in, out, blocks;
  const float* xf;  // [N, in]
  char* xbase;      // quantised x rows, xrb bytes apart (null: W8A16)
  size_t xrb;
  const uint8_t* w;  // weight rows, rb bytes apart
  size_t rb;
  QuantOut<T> y;
  int64_t ahead, x_rows;

  void groups(int64_t g0, int64_t g1, int64_t count) const {
    QuantRow xq[kXRows];
    const float* xr[kXRows];
    float v[kRowGroup * kXRows];
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t o0 = g * kRowGroup, rows = std::min<int64_t>(kRowGroup, out - o0);
      const uint8_t* wr = w + size_t(o0) * rb;
      // The first pass over the group reads it from memory: it prefetches a
      // later group (when that is not past the end).
      const uint8_t* pf = g + ahead < count ? wr + ahead * kRowGroup * rb : nullptr;
      for (int64_t n = 0; n < N;) {
        const int64_t c = N - n >= x_rows ? x_rows : N - n >= 2 ? 2 : 1;
        for (int64_t j = 0; j < c; ++j) {
          xq[j] = xbase ? xrow_at(xbase + (n + j) * xrb, in, blocks) : QuantRow{};
          xr[j] = xf + (n + j) * in;
        }
        const uint8_t* p = n == 0 ? pf : nullptr;
        if (rows == kRowGroup && c == 4)
          dot_rows<kRowGroup, 4>(t, wr, rb, xq, xr, in, v, p);
        else if (rows == kRowGroup && c == 2)
          dot_rows<kRowGroup, 2>(t, wr, rb, xq, xr, in, v, p);
        else if (rows == kRowGroup)
          dot_rows<kRowGroup, 1>(t, wr, rb, xq, xr, in, v, p);
        else
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < c; ++j)
              dot_rows<1, 1>(t, wr + r * rb, rb, xq + j, xr + j, in, v + r * c + j, nullptr);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < c; ++j) y.store(n + j, o0 + r, v[r * c + j]);
        n += c;
      }
    }
  }
};

template <typename T>
void direct(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b) {
  Direct<T> job(QuantOut<T>(y, w, b));
  job.t = w.type;
  job.N = rows_of(x);
  job.in = w.cols();
  job.out = w.rows();
  job.xf = rows_as_f32(x, g_dot_xf);
  const XKind kind = x_kind(job.t);
  job.blocks = kind == XKind::Blocks32    ? job.in / kQK
               : kind == XKind::Blocks256 ? job.in / kQKK
                                          : 1;
  job.xrb = xrow_bytes(job.in, job.blocks);
  char* xbase = kind == XKind::None ? nullptr : scratch<char>(g_dot_xq, size_t(job.N) * job.xrb);
  for (int64_t n = 0; n < job.N && xbase; ++n)
    quantize_x_row(job.t, job.xf + n * job.in, job.in,
                   xrow_at(xbase + n * job.xrb, job.in, job.blocks));
  job.xbase = xbase;
  job.w = w.data.data<uint8_t>();
  job.rb = w.row_bytes();
  job.ahead = prefetch_groups(kRowGroup * job.rb);
  job.x_rows = x_rows_per_pass(job.t);
  const int64_t groups = (job.out + kRowGroup - 1) / kRowGroup;
  // ~64 KiB of weights per task at least: a call's threads are woken once.
  const int64_t grain = std::max<int64_t>(1, int64_t(65536 / (kRowGroup * job.rb)));
  // One captured pointer: the std::function holds it without allocating.
  const Direct<T>* j = &job;
  parallel_for(groups, grain, [j, groups](int64_t g0, int64_t g1) { j->groups(g0, g1, groups); });
}

}  // namespace

void quant_linear_direct(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b) {
  NK_CHECK(w.layout == QuantLayout::Rows,
           "quant_linear_direct: the {} weight {} is packed; the direct kernel reads rows",
           quant_type_name(w.type), shape_str(w.shape));
  if (x.dtype() == DType::F32)
    direct<float>(y, x, w, b);
  else
    direct<bf16>(y, x, w, b);
}

}  // namespace nk::ops::NK_CPU_NS
