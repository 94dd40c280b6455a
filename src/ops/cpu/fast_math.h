// Branch-free exp and sigmoid that GCC vectorizes without -ffast-math (libm's
// expf/tanhf are not vectorized). Relative error about 2 ulp over the clamped
// range; exp saturates at exp(+-88.3) instead of overflowing.
#pragma once
#include <algorithm>
#include <bit>
#include <cstdint>

#include "ops/cpu/level.h"

namespace nk::ops::NK_CPU_NS {

inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.3f), 88.3f);
  // x = n ln2 + r, |r| <= ln2/2; n rounded with the 1.5*2^23 trick.
  constexpr float kRound = 12582912.f;
  float t = x * 1.44269504089f + kRound;
  float n = t - kRound;
  float r = x - n * 0.693145751953125f - n * 1.42860682030941723e-6f;
  // Taylor to r^7: truncation error < 5e-9 relative on |r| <= 0.347.
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  int32_t e = int32_t(n) + 127;  // n in [-126, 127]: a normal power of two
  return p * std::bit_cast<float>(uint32_t(e) << 23);
}

inline float fast_sigmoid(float x) {
  return 1.f / (1.f + fast_exp(-x));
}

}  // namespace nk::ops::NK_CPU_NS
