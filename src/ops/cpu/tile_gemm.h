// Small fp32 matrix products on cache-resident tiles, the inner loop of the
// flash-attention kernels: C[M,N] (+)= A[M,K] B[K,N], all row-major with
// leading dimensions (elements). Tiles are at most a few hundred in any
// dimension, so there is no packing: B rows are read straight from L1/L2.
#pragma once
#include <algorithm>
#include <cstdint>
#ifdef __AVX512F__
#include <immintrin.h>

#include "ops/cpu/level.h"
#endif

namespace nk::ops::NK_CPU_NS {

#ifdef __AVX512F__
namespace tile_gemm_detail {

// R rows x NV 16-float vectors of C held in registers over the whole K loop;
// the last vector is masked to the columns that exist.
template <int R, int NV>
inline void block(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                  int64_t ldc, __mmask16 last, bool accumulate) {
  __m512 c[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      c[r][v] = accumulate
                    ? _mm512_maskz_loadu_ps(v == NV - 1 ? last : 0xFFFF, C + r * ldc + 16 * v)
                    : _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      b[v] = _mm512_maskz_loadu_ps(v == NV - 1 ? last : 0xFFFF, B + k * ldb + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(A[r * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_fmadd_ps(a, b[v], c[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      _mm512_mask_storeu_ps(C + r * ldc + 16 * v, v == NV - 1 ? last : 0xFFFF, c[r][v]);
}

template <int R>
inline void rows(int nv, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                 float* C, int64_t ldc, __mmask16 last, bool acc) {
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
  constexpr int kRows = 6;  // 6 x 4 accumulators + 4 B vectors fit the 32 zmm registers
  for (int64_t j0 = 0; j0 < N; j0 += 64) {
    const int64_t n = std::min<int64_t>(64, N - j0);
    const int nv = int((n + 15) / 16);
    const __mmask16 last = n % 16 ? __mmask16((1u << (n % 16)) - 1) : __mmask16(0xFFFF);
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

#else  // portable fallback: the j loop vectorizes on any SIMD width

inline void tile_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                      int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < M; ++i) {
    float* __restrict c = C + i * ldc;
    if (!accumulate) std::fill(c, c + N, 0.f);
    for (int64_t k = 0; k < K; ++k) {
      const float a = A[i * lda + k];
      const float* __restrict b = B + k * ldb;
      for (int64_t j = 0; j < N; ++j) c[j] += a * b[j];
    }
  }
}

#endif

}  // namespace nk::ops::NK_CPU_NS
