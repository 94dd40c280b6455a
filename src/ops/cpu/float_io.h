// Helpers shared by the CPU kernels of ops/cpu: dtype dispatch and
// vectorizable fp32 <-> storage-type conversions.
#pragma once
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "core/tensor.h"
#include "ops/cpu/level.h"
#include "ops/dtype_dispatch.h"
#include "ops/shapes.h"

namespace nk::ops::NK_CPU_NS {

// Loads/stores written without branches so loops over them auto-vectorize.
inline float load(float v) {
  return v;
}
inline float load(bf16 v) {
  return std::bit_cast<float>(uint32_t(v.bits) << 16);
}
inline float load(f16 v) {
  return f16_to_f32(v);
}

template <typename T>
inline T store(float v);
template <>
inline float store<float>(float v) {
  return v;
}
// Round to nearest even, NaN kept quiet: bit-identical to f32_to_bf16.
template <>
inline bf16 store<bf16>(float v) {
  uint32_t u = std::bit_cast<uint32_t>(v);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t nan = (u >> 16) | 0x40u;
  return bf16{uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : r)};
}
template <>
inline f16 store<f16>(float v) {
  return f32_to_f16(v);
}

#if defined(__AVX2__) && defined(__F16C__)
// Eight values of T (float, bf16 or f16) at p as f32 lanes, each exactly
// load's value: f16 through F16C, bf16 as the f32's high half.
template <typename T>
inline __m256 load8(const void* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_loadu_ps(static_cast<const float*>(p));
  } else {
    const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(p));
    if constexpr (std::is_same_v<T, f16>)
      return _mm256_cvtph_ps(h);
    else
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}
#endif

// dst f32[n] <- src T[n] (load's values). f16 goes 8 at a time through F16C
// where the level has it (x86-64-v3 does): exact, as f16_to_f32 is, but
// vectorised, which the scalar conversion with its subnormal loop is not.
template <typename T>
inline void load_row(float* dst, const T* src, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, size_t(n) * sizeof(float));
  } else {
    int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
    if constexpr (std::is_same_v<T, f16>)
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8<f16>(src + i));
#endif
    for (; i < n; ++i) dst[i] = load(src[i]);
  }
}

}  // namespace nk::ops::NK_CPU_NS
