// The dropout mask as a pure function of (seed, element index): every backend
// and the reference draw the same mask, and a backward pass regenerates it
// instead of storing it.
#pragma once
#include <cstdint>

// Callable from CUDA kernels too (ops/cuda/elementwise.cu).
#ifdef __CUDACC__
#define NK_HOST_DEVICE __host__ __device__
#else
#define NK_HOST_DEVICE
#endif

namespace nk::ops {

// Whether element i survives dropout with probability p under `seed`: a
// splitmix64 hash of seed and i, its top 24 bits as a uniform u in [0, 1),
// kept when u >= p.
NK_HOST_DEVICE inline bool dropout_keeps(uint64_t seed, int64_t i, float p) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + uint64_t(i) * 0xD1B54A32D192ED03ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(z >> 40) * (1.f / 16777216.f) >= p;
}

}  // namespace nk::ops
