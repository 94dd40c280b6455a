// Helpers shared by the CPU kernels of ops/cpu: dtype dispatch and
// vectorizable fp32 <-> storage-type conversions.
#pragma once
#include <bit>
#include <cstdint>

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

}  // namespace nk::ops::NK_CPU_NS
