#include "core/dtype.h"

#include "core/error.h"

namespace nk {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::F64:
      return 8;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::U8:
      return 1;
  }
  NK_CHECK(false, "bad dtype {}", int(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::F64:
      return "f64";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
    case DType::U8:
      return "u8";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "f32" || s == "fp32" || s == "float32") return DType::F32;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "f16" || s == "fp16" || s == "float16") return DType::F16;
  fail("unknown dtype '{}' (expected f32, bf16 or f16)", s);
}

// IEEE half: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
float f16_to_f32(f16 v) {
  uint32_t sign = uint32_t(v.bits & 0x8000) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1f;
  uint32_t man = v.bits & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400));
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16 f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{uint16_t(sign | 0x7e00)};   // NaN
  if (a >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00)};  // overflow to inf
  if (a < 0x38800000u) {                                      // subnormal or zero
    if (a < 0x33000000u) return f16{sign};
    uint32_t exp = a >> 23, man = (a & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - exp;  // 14..24
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return f16{uint16_t(sign | half)};
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u;  // rebias 127 -> 15 and round
  return f16{uint16_t(sign | (r >> 13))};
}

}  // namespace nk
