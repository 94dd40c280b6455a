// Quantised weights on the CPU, part 4: the integer product for many rows of
// x (batched decode and prefill) on AVX-512 VNNI, y[N, out] = x[N, in] W^T + b.
//
// The direct kernel (quant_dot.cc) sums each (weight row, x row) pair on its
// own, so every x row costs the unpacking and the horizontal work again; with
// 16 rows it is compute-bound. Here W is cut into sub-blocks of 16 weight
// rows by one scale's run of values (32; 16 for Q6_K) and each sub-block is
// unpacked once per call into a tile of unsigned bytes laid out for vpdpbusd:
//
//   tile[k4][r][j] = u of weight row r at value 4 k4 + j   (16 rows x 4 bytes = one zmm)
//
// so that one vpdpbusd of tile[k4] with 4 bytes of an x row broadcast to all
// lanes adds 4 products to each of the 16 rows' sums. After a sub-block, lane
// r holds S_r = sum u_r q over it (q: x quantised to int8 in blocks of 32 with
// a scale dx each, as the direct kernel does for Q8_0 and Q4_0; see x_block),
// and the sub-block's part of y is
//
//   dx (a_r (S_r - k T) - b_r T)            T = sum q over the sub-block
//
// with the weight's values w = a_r (u - k) - b_r: Q8_0 u = q + 128 (k 128, a
// = d); Q4_0 u = q (k 8, a = d); Q4_K u = q (a = d sc, b = dmin m); Q6_K u = q
// (k 32, a = d sc); W8A8 u = q + 128 (k 128, a = 1, the row scale applied at
// the end). k T is an integer, so S starts from -k T; b T (Q4_K) is one more
// FMA. Each y value is summed in f32 across sub-blocks in a fixed order by
// one thread, so y does not depend on the thread count; for Q8_0, Q4_0 and
// W8A8 it equals the direct kernel's y up to the order of the f32 sums (the
// integers are the same).
//
// Work: threads take groups of 16 weight rows; a group's tiles (16 x in
// bytes, in L1/L2) are unpacked once and met by x in passes of up to 8 rows,
// whose 8 i32 sums and 8 f32 accumulators stay in registers; x's rows are
// interleaved by pass (XPrep), so a pass reads its rows' words side by side.
//
// A weight packed at load (ops::quant_pack, QuantLayout::Packed16) already
// holds each group's 16 rows in lane order: its tiles are made where they
// lie, a load and a mask or two each, as a pass needs them (PackedTiles), so
// nothing is transposed nor written out, and one x row (decode at batch 1)
// takes this kernel too. Only Q6_K's tiles, which take 6 operations each to
// make, are still unpacked once per call for more than one pass.

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() (`__Y = __Y`),
// which its own -Wmaybe-uninitialized flags once inlined: off in this file
// (clang, which builds the sanitizer tree, has no such warning).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"
#include "ops/cpu/quant_blocks.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define NK_QUANT_VNNI 1
#include <immintrin.h>
#endif

namespace nk::ops::NK_CPU_NS {

#ifdef NK_QUANT_VNNI

bool quant_gemm_available(QuantType t, int64_t in) {
  switch (t) {
    case QuantType::Q8_0:
    case QuantType::Q4_0:
    case QuantType::Q4_K:
    case QuantType::Q6_K:
      return true;
    case QuantType::W8A8:
      return in % 32 == 0;
    case QuantType::W8A16:
    case QuantType::F16:
    case QuantType::BF16:
      break;
  }
  return false;
}

namespace {

constexpr int kLanes = 16;  // weight rows per group: one i32 / f32 lane each
constexpr int kPass = 8;    // x rows per pass over a group's tiles

// Values per sub-block (one weight scale's run).
int sub_width(QuantType t) {
  return t == QuantType::Q6_K ? 16 : 32;
}
// k of w = a (u - k) - b: the offset of the unsigned bytes.
int32_t offset_k(QuantType t) {
  switch (t) {
    case QuantType::Q8_0:
    case QuantType::W8A8:
      return 128;
    case QuantType::Q4_0:
      return 8;
    case QuantType::Q6_K:
      return 32;
    default:
      return 0;
  }
}
// Values per x scale: blocks of 32 (W8A8: the row). The direct kernel
// quantises x for the K types in blocks of 256, as llama.cpp's Q8_K; here x's
// scale is applied per sub-block anyway, so 32 costs nothing and rounds x
// finer. (With 256, prefill through q6_k and q4_k_m weights in
// gguf_import_test was 0.122 and 0.123 of the logits' RMS off the dense
// product, over its 0.12 bound; with 32, 0.074 and 0.083.)
int64_t x_block(QuantType t, int64_t in) {
  return t == QuantType::W8A8 ? in : kQK;
}

inline __m128i load128(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

// z[k] lane r = bytes [4 k, 4 k + 4) of the 16 at row r + off (k < 4), row
// r at p + r rb: a 16 x 4 transpose of 4-byte words. B_i holds rows i, i + 4,
// i + 8, i + 12 in its four 128-bit lanes; two rounds of unpacks gather word
// k of rows 4 L .. 4 L + 3 into lane L.
inline void transpose16x4(const uint8_t* p, size_t rb, size_t off, __m512i* z) {
  __m512i b[4];
  const uint8_t* q = p + off;
  for (int i = 0; i < 4; ++i, q += rb) {
    __m512i v = _mm512_zextsi128_si512(load128(q));
    v = _mm512_inserti32x4(v, load128(q + 4 * rb), 1);
    v = _mm512_inserti32x4(v, load128(q + 8 * rb), 2);
    b[i] = _mm512_inserti32x4(v, load128(q + 12 * rb), 3);
  }
  const __m512i t0 = _mm512_unpacklo_epi32(b[0], b[1]), t1 = _mm512_unpackhi_epi32(b[0], b[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(b[2], b[3]), t3 = _mm512_unpackhi_epi32(b[2], b[3]);
  z[0] = _mm512_unpacklo_epi64(t0, t2);
  z[1] = _mm512_unpackhi_epi64(t0, t2);
  z[2] = _mm512_unpacklo_epi64(t1, t3);
  z[3] = _mm512_unpackhi_epi64(t1, t3);
}
// The same for 32 bytes: z[0..8).
inline void transpose16x8(const uint8_t* p, size_t rb, size_t off, __m512i* z) {
  transpose16x4(p, rb, off, z);
  transpose16x4(p, rb, off + 16, z + 4);
}

inline void store_tile(uint8_t* tile, int k4, __m512i v) {
  _mm512_store_si512(reinterpret_cast<__m512i*>(tile + 64 * k4), v);
}

// The f16 values at p + r rb + off (r < 16) in f32 lanes: 16 two-byte copies
// and one conversion (a gather was slower).
inline __m512 halves16(const uint8_t* p, size_t rb, size_t off) {
  alignas(32) uint16_t h[kLanes];
  for (int r = 0; r < kLanes; ++r) std::memcpy(&h[r], p + r * rb + off, 2);
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h)));
}
// Where unpack reads a group's 16 rows. words4(off, z): z[k] lane r = the
// 4 bytes at row offset off + 4 k of row r (k < 4); words8: k < 8;
// halves(off): the f16 at row offset off of each row, in f32 lanes.
// The row layout (row r at p + r rb), transposed on the fly:
struct RowSource {
  const uint8_t* p;
  size_t rb;
  void words4(size_t off, __m512i* z) const { transpose16x4(p, rb, off, z); }
  void words8(size_t off, __m512i* z) const { transpose16x8(p, rb, off, z); }
  __m512 halves(size_t off) const { return halves16(p, rb, off); }
};
// The packed layout (QuantLayout::Packed16, the group at p): the unit at row
// offset off of the 16 rows is at p + 16 off, already in lane order.
struct PackedSource {
  const uint8_t* p;
  void words4(size_t off, __m512i* z) const {
    for (int k = 0; k < 4; ++k) z[k] = _mm512_loadu_si512(p + 16 * off + 64 * size_t(k));
  }
  void words8(size_t off, __m512i* z) const {
    words4(off, z);
    words4(off + 16, z + 4);
  }
  __m512 halves(size_t off) const {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * off)));
  }
};

// Byte j of each 4-byte lane as f32, unsigned or signed.
inline __m512 byte_u(__m512i w, int j) {
  return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(w, 8 * j), _mm512_set1_epi32(255)));
}
inline __m512 byte_s(__m512i w, int j) {
  return _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(w, 24 - 8 * j), 24));
}

// A group's unpacked weights: tiles [nsub][W / 4][16][4] u8, a and b [nsub][16] f32.
struct Tiles {
  uint8_t* u;
  float* a;
  float* b;  // Q4_K only
};

// Unpacks the `in` values of a group's 16 rows (read from src) into out: the
// scales a and b, and with `tiles` the tiles u too (a packed group's tiles
// are read where they lie instead: PackedTiles). (The next group is read
// ahead by pass, during the products: prefetching while unpacking made a
// batched decode step 5% slower.)
template <typename Src>
void unpack(QuantType t, const Src& src, int64_t in, const Tiles& out, bool tiles) {
  const __m512i m4 = _mm512_set1_epi8(15), flip = _mm512_set1_epi8(char(0x80));
  __m512i z[24];
  switch (t) {
    case QuantType::Q8_0:
    case QuantType::Q4_0: {
      const bool q8 = t == QuantType::Q8_0;
      const size_t bb = q8 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
      for (int64_t s = 0; s < in / kQK; ++s) {
        uint8_t* tile = out.u + s * 512;
        if (tiles && q8) {
          src.words8(size_t(s) * bb + 2, z);
          for (int k = 0; k < 8; ++k) store_tile(tile, k, _mm512_xor_si512(z[k], flip));
        } else if (tiles) {
          src.words4(size_t(s) * bb + 2, z);
          for (int k = 0; k < 4; ++k) {
            store_tile(tile, k, _mm512_and_si512(z[k], m4));
            store_tile(tile, k + 4, _mm512_and_si512(_mm512_srli_epi16(z[k], 4), m4));
          }
        }
        _mm512_store_ps(out.a + s * kLanes, src.halves(size_t(s) * bb));
      }
      return;
    }
    case QuantType::W8A8:
      for (int64_t s = 0; s < in / 32; ++s) {
        if (tiles) {
          src.words8(size_t(s) * 32, z);
          for (int k = 0; k < 8; ++k) store_tile(out.u + s * 512, k, _mm512_xor_si512(z[k], flip));
        }
        _mm512_store_ps(out.a + s * kLanes, _mm512_set1_ps(1.f));
      }
      return;
    case QuantType::Q4_K:
      for (int64_t b = 0; b < in / kQKK; ++b) {
        const size_t base = size_t(b) * sizeof(BlockQ4_K);
        for (int c = 0; c < 4 && tiles; ++c) {
          src.words8(base + offsetof(BlockQ4_K, qs) + 32 * size_t(c), z);
          uint8_t* lo = out.u + (8 * b + 2 * c) * 512;
          for (int k = 0; k < 8; ++k) {
            store_tile(lo, k, _mm512_and_si512(z[k], m4));
            store_tile(lo + 512, k, _mm512_and_si512(_mm512_srli_epi16(z[k], 4), m4));
          }
        }
        // The block's first 16 bytes transposed: word 0 is d | dmin << 16,
        // words 1-3 the 12 scale bytes, decoded 4 codes a word (q4k_scales).
        src.words4(base, z);
        const __m512i lo6 = _mm512_set1_epi32(0x3f3f3f3f), lo4 = _mm512_set1_epi32(0x0f0f0f0f),
                      b45 = _mm512_set1_epi32(0x30303030);
        const __m512i sc[2] = {_mm512_and_si512(z[1], lo6),
                               _mm512_or_si512(_mm512_and_si512(z[3], lo4),
                                               _mm512_and_si512(_mm512_srli_epi32(z[1], 2), b45))};
        const __m512i mn[2] = {_mm512_and_si512(z[2], lo6),
                               _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(z[3], 4), lo4),
                                               _mm512_and_si512(_mm512_srli_epi32(z[2], 2), b45))};
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(z[0]));
        const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(z[0], 16)));
        for (int j = 0; j < 8; ++j) {
          _mm512_store_ps(out.a + (8 * b + j) * kLanes, _mm512_mul_ps(d, byte_u(sc[j / 4], j % 4)));
          _mm512_store_ps(out.b + (8 * b + j) * kLanes,
                          _mm512_mul_ps(dmin, byte_u(mn[j / 4], j % 4)));
        }
      }
      return;
    case QuantType::Q6_K:
      // Sub-block s = 16 b + 8 h + 2 k + (l >= 16) holds values 32 k + l of
      // half h (layout in ops/quant.h); its words 4 j' .. of the 32 values
      // 32 k .. are z words j = 4 (l >= 16) + j'.
      for (int64_t b = 0; b < in / kQKK; ++b) {
        const size_t base = size_t(b) * sizeof(BlockQ6_K);
        for (int h = 0; h < 2 && tiles; ++h) {
          src.words8(base + 64 * size_t(h), z);                                 // ql0
          src.words8(base + 64 * size_t(h) + 32, z + 8);                        // ql1
          src.words8(base + offsetof(BlockQ6_K, qh) + 32 * size_t(h), z + 16);  // qh
          const __m512i bits45 = _mm512_set1_epi8(0x30);
          for (int k = 0; k < 4; ++k)
            for (int j = 0; j < 8; ++j) {
              const __m512i ql = z[(k & 1) * 8 + j], qh = z[16 + j];
              const __m512i lo = _mm512_and_si512(k < 2 ? ql : _mm512_srli_epi16(ql, 4), m4);
              const __m512i hb = k == 0   ? _mm512_slli_epi16(qh, 4)
                                 : k == 1 ? _mm512_slli_epi16(qh, 2)
                                 : k == 2 ? qh
                                          : _mm512_srli_epi16(qh, 2);
              const int64_t s = 16 * b + 8 * h + 2 * k + j / 4;
              store_tile(out.u + s * 256, j % 4, _mm512_or_si512(lo, _mm512_and_si512(hb, bits45)));
            }
        }
        // The 16 signed scales transposed, 4 a word.
        src.words4(base + offsetof(BlockQ6_K, scales), z);
        const __m512 d = src.halves(base + offsetof(BlockQ6_K, d));
        for (int j = 0; j < 16; ++j)
          _mm512_store_ps(out.a + (16 * b + j) * kLanes, _mm512_mul_ps(d, byte_s(z[j / 4], j % 4)));
      }
      return;
    case QuantType::W8A16:
    case QuantType::F16:
    case QuantType::BF16:
      break;
  }
}

// x prepared once per call, for passes of P rows (P = N up to kPass, else
// kPass): its rows in blocks of P, each block's values interleaved, so that
// a pass finds the x words (and scales) of its rows side by side: q (i32
// words of 4 int8 values) at ((n / P) (in / 4) + w) P + n % P, and per row
// and sub-block s the start of S (-k T), dx and dx T (read by Q4_K only) at
// ((n / P) nsub + s) P + n % P.
struct XPrep {
  const int32_t* q;
  const int32_t* start;
  const float* dx;
  const float* dxt;
};

// Where a pass finds its tiles: sub(s) for sub-block s, then (k) for step
// k < W / 4. BufTiles: unpacked into a buffer (Tiles::u); PackedTiles<T>:
// made from a packed group's bytes (at p) as they are read, a load and a
// mask or two each, so that a group met by one pass is never written out.
struct BufTiles {
  const uint8_t* u;
  int64_t stride;  // bytes per sub-block: W * 16
  struct Sub {
    const uint8_t* t;
    __m512i operator()(int k) const {
      return _mm512_load_si512(reinterpret_cast<const __m512i*>(t + 64 * k));
    }
  };
  Sub sub(int64_t s) const { return {u + s * stride}; }
};

inline __m512i load_group(const uint8_t* p) {
  return _mm512_loadu_si512(p);
}
inline __m128i shift_count(int n) {
  return _mm_cvtsi32_si128(n);
}

template <QuantType T>
struct PackedTiles;
// Q8_0 and W8A8: the signed bytes flipped to unsigned (u = q + 128).
template <>
struct PackedTiles<QuantType::Q8_0> {
  const uint8_t* p;
  size_t block, head;  // bytes per block of a row, bytes before its values
  struct Sub {
    const uint8_t* q;
    __m512i operator()(int k) const {
      return _mm512_xor_si512(load_group(q + 64 * k), _mm512_set1_epi8(char(0x80)));
    }
  };
  Sub sub(int64_t s) const { return {p + kLanes * (size_t(s) * block + head)}; }
};
template <>
struct PackedTiles<QuantType::Q4_0> {
  const uint8_t* p;
  struct Sub {
    const uint8_t* q;
    __m512i operator()(int k) const {  // values 4 k ..: low nibbles of words k < 4, then high
      const __m512i v = load_group(q + 64 * (k & 3));
      return _mm512_and_si512(k < 4 ? v : _mm512_srli_epi16(v, 4), _mm512_set1_epi8(15));
    }
  };
  Sub sub(int64_t s) const { return {p + kLanes * (size_t(s) * sizeof(BlockQ4_0) + 2)}; }
};
template <>
struct PackedTiles<QuantType::Q4_K> {
  const uint8_t* p;
  struct Sub {  // sub-block j of a block: 32 bytes of qs at 32 (j / 2), nibble j % 2
    const uint8_t* q;
    __m128i shift;
    __m512i operator()(int k) const {
      return _mm512_and_si512(_mm512_srl_epi16(load_group(q + 64 * k), shift),
                              _mm512_set1_epi8(15));
    }
  };
  Sub sub(int64_t s) const {
    const int64_t b = s / 8, j = s % 8;
    return {
        p + kLanes * (size_t(b) * sizeof(BlockQ4_K) + offsetof(BlockQ4_K, qs) + 32 * size_t(j / 2)),
        shift_count(4 * int(j % 2))};
  }
};
template <>
struct PackedTiles<QuantType::Q6_K> {
  const uint8_t* p;
  // Sub-block s = 16 b + 8 h + 2 c + i (unpack's Q6_K case): words 4 i + k
  // of ql (nibble c / 2) at 64 h + 32 (c % 2) and of qh (bits 2 c) at 32 h;
  // the two high bits reach bits 4-5 by a left then a right shift.
  struct Sub {
    const uint8_t *ql, *qh;
    __m128i lo, left, right;
    __m512i operator()(int k) const {
      const __m512i l =
          _mm512_and_si512(_mm512_srl_epi16(load_group(ql + 64 * k), lo), _mm512_set1_epi8(15));
      const __m512i h = _mm512_srl_epi16(_mm512_sll_epi16(load_group(qh + 64 * k), left), right);
      return _mm512_or_si512(l, _mm512_and_si512(h, _mm512_set1_epi8(0x30)));
    }
  };
  Sub sub(int64_t s) const {
    const int64_t b = s / 16, h = (s / 8) % 2, c = (s / 2) % 4, i = s % 2;
    const size_t base = size_t(b) * sizeof(BlockQ6_K);
    return {p + kLanes * (base + 64 * size_t(h) + 32 * size_t(c % 2) + 16 * size_t(i)),
            p + kLanes * (base + offsetof(BlockQ6_K, qh) + 32 * size_t(h) + 16 * size_t(i)),
            shift_count(4 * int(c / 2)), shift_count(c < 2 ? 4 - 2 * int(c) : 0),
            shift_count(c < 2 ? 0 : 2 * int(c) - 4)};
  }
};

// C x rows (n0 ..) against a group's tiles: acc[c] lane r += y[n0 + c, row r].
//
// The first pass over a group also reads the next group's bytes into L2
// (pf: pf_bytes, one contiguous run of 16 rows; null: none), a share per
// sub-block, so that memory is read while the tiles are multiplied: without
// it the unpacking of each group waited on memory (a third of a batched
// decode step), and prefetching during the unpacking itself only added
// instructions.
template <int C, int W, bool B, int P, typename Src>
void pass(const Src& tiles, const Tiles& t, const XPrep& x, int64_t nsub, int64_t in, int64_t n0,
          float* acc_mem, const uint8_t* pf, size_t pf_bytes) {
  __m512 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm512_load_ps(acc_mem + c * kLanes);
  for (int64_t s = 0; s < nsub; ++s) {
    if (pf) {
      const size_t lo = pf_bytes * size_t(s) / size_t(nsub),
                   hi = pf_bytes * size_t(s + 1) / size_t(nsub);
      for (size_t off = (lo + 63) & ~size_t(63); off < hi; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(pf + off), _MM_HINT_T1);
    }
    const int64_t xs = (n0 / P * nsub + s) * P;  // this block's sub-block s
    const int32_t* xq = x.q + (n0 / P * (in / 4) + s * (W / 4)) * P;
    __m512i sum[C];
    for (int c = 0; c < C; ++c) sum[c] = _mm512_set1_epi32(x.start[xs + c]);
    const auto sub = tiles.sub(s);
#pragma GCC unroll 8
    for (int k = 0; k < W / 4; ++k) {
      const __m512i u = sub(k);
      for (int c = 0; c < C; ++c)
        sum[c] = _mm512_dpbusd_epi32(sum[c], u, _mm512_set1_epi32(xq[k * P + c]));
    }
    const __m512 a = _mm512_load_ps(t.a + s * kLanes);
    for (int c = 0; c < C; ++c) {
      const __m512 ad = _mm512_mul_ps(a, _mm512_set1_ps(x.dx[xs + c]));
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[c]), ad, acc[c]);
    }
    if constexpr (B) {
      const __m512 b = _mm512_load_ps(t.b + s * kLanes);
      for (int c = 0; c < C; ++c)
        acc[c] = _mm512_fnmadd_ps(b, _mm512_set1_ps(x.dxt[xs + c]), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) _mm512_store_ps(acc_mem + c * kLanes, acc[c]);
}

template <typename T>
struct Gemm {
  explicit Gemm(QuantOut<T> o) : y(o) {}
  QuantType t;
  int64_t N, in, out, nsub;
  XPrep x;
  const uint8_t* w;
  size_t rb;
  bool packed;  // QuantLayout::Packed16
  QuantOut<T> y;

  // Every x row against a group's tiles (from src), kPass rows at a time
  // (the last pass C < kPass rows), the first pass reading the next group's
  // bytes (pf, or null). One: N <= kPass (x's blocks of N rows, XPrep).
  template <int W, bool B, bool One, typename Src, int C = kPass>
  void tail(const Src& src, int64_t c, int64_t n, float* acc, const Tiles& tl,
            const uint8_t* pf) const {
    constexpr int P = One ? C : kPass;
    if (c == C) return pass<C, W, B, P>(src, tl, x, nsub, in, n, acc + n * kLanes, pf, kLanes * rb);
    if constexpr (C > 1) tail<W, B, One, Src, C - 1>(src, c, n, acc, tl, pf);
  }
  template <int W, bool B, typename Src>
  void all_x(const Src& src, const Tiles& tl, float* acc, const uint8_t* pf) const {
    if (N <= kPass) return tail<W, B, true>(src, N, 0, acc, tl, pf);
    int64_t n = 0;
    for (; n + kPass <= N; n += kPass, pf = nullptr)
      pass<kPass, W, B, kPass>(src, tl, x, nsub, in, n, acc + n * kLanes, pf, kLanes * rb);
    if (n < N) tail<W, B, false>(src, N - n, n, acc, tl, pf);
  }
  // The group's tiles from src, by type.
  template <typename Src>
  void by_type(const Src& src, const Tiles& tl, float* acc, const uint8_t* pf) const {
    if (t == QuantType::Q6_K)
      all_x<16, false>(src, tl, acc, pf);
    else if (t == QuantType::Q4_K)
      all_x<32, true>(src, tl, acc, pf);
    else
      all_x<32, false>(src, tl, acc, pf);
  }

  void groups(int64_t g0, int64_t g1) const {
    // Per-thread buffers (parallel_for's threads are the pool's, each with
    // its own), grown as needed: a group's tiles, its sums for every x row,
    // and the last group's rows padded to 16.
    thread_local std::vector<char> tbuf, abuf, last;
    const size_t ub = size_t(in * kLanes), fb = size_t(nsub * kLanes);
    float* fl = scratch<float>(tbuf, ub / 4 + 2 * fb);
    const Tiles tl{reinterpret_cast<uint8_t*>(fl), fl + ub / 4, fl + ub / 4 + fb};
    const BufTiles buf{tl.u, (t == QuantType::Q6_K ? 16 : 32) * kLanes};
    // A packed group is read in place, its tiles made as they are needed
    // (again in every pass), except Q6_K's for more than one pass: unpacked
    // once then (no transposes: loads, masks and stores). bench_quant
    // --sweep, [2048 x 2048], 2 threads, N = 16, ms: q4_0 from the rows
    // 0.280, packed in place 0.216; q6_k from the rows 0.314-0.333, packed in
    // place 0.356-0.360 (its tiles take 6 operations each to make), packed
    // and unpacked once 0.300.
    const bool in_place = packed && (t != QuantType::Q6_K || N <= kPass);
    float* acc = scratch<float>(abuf, size_t(N * kLanes));
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t o0 = g * kLanes, n_rows = std::min<int64_t>(kLanes, out - o0);
      const uint8_t* p = w + size_t(o0) * rb;
      if (n_rows < kLanes) {  // rows past the end: copies of the last, not stored
        uint8_t* pad = scratch<uint8_t>(last, kLanes * rb);
        for (int r = 0; r < kLanes; ++r)
          std::memcpy(pad + r * rb, p + std::min<int64_t>(r, n_rows - 1) * rb, rb);
        p = pad;
      }
      std::fill(acc, acc + N * kLanes, 0.f);
      // The next group of this thread's, when whole (the padded last is not).
      const uint8_t* pf = g + 1 < g1 && o0 + 2 * kLanes <= out ? p + kLanes * rb : nullptr;
      if (!packed) {
        unpack(t, RowSource{p, rb}, in, tl, true);
        by_type(buf, tl, acc, pf);
      } else if (!in_place) {  // whole groups (quant_pack asks for rows in 16s)
        unpack(t, PackedSource{p}, in, tl, true);
        by_type(buf, tl, acc, pf);
      } else {
        unpack(t, PackedSource{p}, in, tl, false);
        switch (t) {
          case QuantType::Q8_0:
            by_type(PackedTiles<QuantType::Q8_0>{p, sizeof(BlockQ8_0), 2}, tl, acc, pf);
            break;
          case QuantType::W8A8:
            by_type(PackedTiles<QuantType::Q8_0>{p, 32, 0}, tl, acc, pf);
            break;
          case QuantType::Q4_0:
            by_type(PackedTiles<QuantType::Q4_0>{p}, tl, acc, pf);
            break;
          case QuantType::Q4_K:
            by_type(PackedTiles<QuantType::Q4_K>{p}, tl, acc, pf);
            break;
          case QuantType::Q6_K:
            by_type(PackedTiles<QuantType::Q6_K>{p}, tl, acc, pf);
            break;
          default:
            break;
        }
      }
      for (int64_t n = 0; n < N; ++n)
        for (int64_t r = 0; r < n_rows; ++r) y.store(n, o0 + r, acc[n * kLanes + r]);
    }
  }
};

std::vector<char> g_gemm_xf, g_gemm_xq, g_gemm_start, g_gemm_dx, g_gemm_dxt;

template <typename T>
void gemm(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b) {
  Gemm<T> job(QuantOut<T>(y, w, b));
  job.t = w.type;
  job.N = rows_of(x);
  job.in = w.cols();
  job.out = w.rows();
  const int W = sub_width(job.t);
  const int64_t N = job.N, in = job.in, nsub = in / W, xb = x_block(job.t, in);
  job.nsub = nsub;
  const float* xf = rows_as_f32(x, g_gemm_xf);
  const int64_t P = std::min<int64_t>(N, kPass), NP = (N + P - 1) / P * P;  // XPrep's blocks
  int32_t* q = scratch<int32_t>(g_gemm_xq, size_t(NP * in / 4));
  int32_t* start = scratch<int32_t>(g_gemm_start, size_t(NP * nsub));
  float* dx = scratch<float>(g_gemm_dx, size_t(NP * nsub));
  float* dxt = scratch<float>(g_gemm_dxt, size_t(NP * nsub));
  const int32_t k = offset_k(job.t);
  parallel_for(N, std::max<int64_t>(1, 16384 / in), [&](int64_t n0, int64_t n1) {
    thread_local std::vector<char> row;
    int8_t* qn = scratch<int8_t>(row, size_t(in));
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t blk = n / P, lane = n % P;
      for (int64_t b0 = 0; b0 < in; b0 += xb) {
        const float d = quantize_x_block(xf + n * in + b0, xb, qn + b0);
        for (int64_t s = b0 / W; s < (b0 + xb) / W; ++s) {
          int32_t sum = 0;
          for (int i = 0; i < W; ++i) sum += qn[s * W + i];
          const int64_t at = (blk * nsub + s) * P + lane;
          start[at] = -k * sum;
          dx[at] = d;
          dxt[at] = d * float(sum);
        }
      }
      for (int64_t w = 0; w < in / 4; ++w)
        std::memcpy(q + (blk * (in / 4) + w) * P + lane, qn + 4 * w, 4);
    }
  });
  job.x = XPrep{q, start, dx, dxt};
  job.w = w.data.data<uint8_t>();
  job.rb = w.row_bytes();
  job.packed = w.layout == QuantLayout::Packed16;
  const int64_t groups = (job.out + kLanes - 1) / kLanes;
  const Gemm<T>* j = &job;
  parallel_for(groups, 1, [j](int64_t g0, int64_t g1) { j->groups(g0, g1); });
}

}  // namespace

void quant_linear_gemm(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b) {
  if (x.dtype() == DType::F32)
    gemm<float>(y, x, w, b);
  else
    gemm<bf16>(y, x, w, b);
}

#else  // no AVX-512 VNNI: quant_linear_forward never takes this path

bool quant_gemm_available(QuantType, int64_t) {
  return false;
}
void quant_linear_gemm(Tensor, const Tensor&, const QuantWeight& w, const Tensor&) {
  throw Error(std::string("quant_linear_gemm: ") + quant_type_name(w.type) +
              " needs AVX-512 VNNI, which this build does not target");
}

#endif

}  // namespace nk::ops::NK_CPU_NS
