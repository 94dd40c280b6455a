// Element types and conversions. bf16/f16 are stored as raw 16-bit patterns;
// arithmetic always happens in fp32.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace nk {

enum class DType : uint8_t { F32, BF16, F16, F64, I32, I64, U8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses "f32"/"float32"/"bf16"/"bfloat16"/"f16"/"float16"; throws nk::Error otherwise.
DType parse_dtype(const std::string& s);

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

inline float bf16_to_f32(bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}

float f16_to_f32(f16 v);
f16 f32_to_f16(float f);

// Generic load/store used by kernels templated on the storage type.
inline float to_f32(float v) {
  return v;
}
inline float to_f32(bf16 v) {
  return bf16_to_f32(v);
}
inline float to_f32(f16 v) {
  return f16_to_f32(v);
}
template <typename T>
inline T from_f32(float v);
template <>
inline float from_f32<float>(float v) {
  return v;
}
template <>
inline bf16 from_f32<bf16>(float v) {
  return f32_to_bf16(v);
}
template <>
inline f16 from_f32<f16>(float v) {
  return f32_to_f16(v);
}

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::BF16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::F16;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::F64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::I32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::I64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::U8;
}

}  // namespace nk
