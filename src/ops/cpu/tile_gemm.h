// Small fp32 matrix products on cache-resident tiles, the inner loop of the
// flash-attention kernels: C[M,N] (+)= A[M,K] B[K,N], all row-major with
// leading dimensions (elements). Tiles are at most a few hundred in any
// dimension, so there is no packing: B rows are read straight from L1/L2.
#pragma once
#include <algorithm>
#include <cstdint>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "ops/cpu/level.h"

namespace nk::ops::NK_CPU_NS {

#if defined(__AVX512F__) || defined(__AVX2__)
namespace tile_gemm_detail {

// The vector registers of this level: W floats, a mask for the last W
// columns, masked loads and stores (zero-filled loads), whole ones,
// broadcast and FMA.
#ifdef __AVX512F__
struct Vec {
  static constexpr int W = 16;
  static constexpr int kRows = 6;  // 6 x 4 accumulators + 4 B vectors of the 32 registers
  using Reg = __m512;
  using Mask = __mmask16;
  static Mask full() { return Mask(0xFFFF); }
  static Mask first(int64_t n) { return Mask((1u << n) - 1); }  // n < W
  static Reg load(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, Mask m, Reg v) { _mm512_mask_storeu_ps(p, m, v); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg set1(float a) { return _mm512_set1_ps(a); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
};
#else
struct Vec {
  static constexpr int W = 8;
  static constexpr int kRows = 3;  // 3 x 4 accumulators + 4 B vectors of the 16 registers
  using Reg = __m256;
  using Mask = __m256i;
  static Mask full() { return _mm256_set1_epi32(-1); }
  static Mask first(int64_t n) {  // n < W: lanes [0, n) set
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Reg load(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  static void store(float* p, Mask m, Reg v) { _mm256_maskstore_ps(p, m, v); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg set1(float a) { return _mm256_set1_ps(a); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
};
#endif
constexpr int W = Vec::W;

// R rows x NV vectors of C held in registers over the whole K loop; the
// last vector is masked to the columns that exist. Each C element is the
// FMA chain over k in order, as the portable loop computes it.
template <int R, int NV>
inline void block(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                  int64_t ldc, Vec::Mask last, bool accumulate) {
  Vec::Reg c[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      c[r][v] = accumulate ? Vec::load(C + r * ldc + W * v, v == NV - 1 ? last : Vec::full())
                           : Vec::zero();
  for (int64_t k = 0; k < K; ++k) {
    Vec::Reg b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      b[v] = Vec::load(B + k * ldb + W * v, v == NV - 1 ? last : Vec::full());
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Vec::Reg a = Vec::set1(A[r * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = Vec::fmadd(a, b[v], c[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      Vec::store(C + r * ldc + W * v, v == NV - 1 ? last : Vec::full(), c[r][v]);
}

template <int R>
inline void rows(int nv, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                 float* C, int64_t ldc, Vec::Mask last, bool acc) {
  switch (nv) {
    case 1:
      return block<R, 1>(K, A, lda, B, ldb, C, ldc, last, acc);
    case 2:
      return block<R, 2>(K, A, lda, B, ldb, C, ldc, last, acc);
    case 3:
      return block<R, 3>(K, A, lda, B, ldb, C, ldc, last, acc);
    default:
      return block<R, 4>(K, A, lda, B, ldb, C, ldc, last, acc);
  }
}

}  // namespace tile_gemm_detail

inline void tile_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                      int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  using namespace tile_gemm_detail;
  constexpr int kRows = Vec::kRows;
  for (int64_t j0 = 0; j0 < N; j0 += 4 * W) {
    const int64_t n = std::min<int64_t>(4 * W, N - j0);
    const int nv = int((n + W - 1) / W);
    const Vec::Mask last = n % W ? Vec::first(n % W) : Vec::full();
    const float* b = B + j0;
    float* c = C + j0;
    int64_t i = 0;
    for (; i + kRows <= M; i += kRows)
      rows<kRows>(nv, K, A + i * lda, lda, b, ldb, c + i * ldc, ldc, last, accumulate);
    switch (M - i) {
      case 5:
        rows<5>(nv, K, A + i * lda, lda, b, ldb, c + i * ldc, ldc, last, accumulate);
        break;
      case 4:
        rows<4>(nv, K, A + i * lda, lda, b, ldb, c + i * ldc, ldc, last, accumulate);
        break;
      case 3:
        rows<3>(nv, K, A + i * lda, lda, b, ldb, c + i * ldc, ldc, last, accumulate);
        break;
      case 2:
        rows<2>(nv, K, A + i * lda, lda, b, ldb, c + i * ldc, ldc, last, accumulate);
        break;
      case 1:
        rows<1>(nv, K, A + i * lda, lda, b, ldb, c + i * ldc, ldc, last, accumulate);
        break;
      default:
        break;
    }
  }
}

#else
#error "ops/cpu/tile_gemm.h is for the kernel levels (ops/cpu_isa.h), AVX2 and up"
#endif

}  // namespace nk::ops::NK_CPU_NS
