// The tile helpers the flash-attention kernels share (attention.cc over whole
// rows, attention_block.cc over one ring block): a per-thread scratch buffer
// and the loads of a block of q, k or v rows into fp32 tiles, straight or
// transposed, scaled on the way.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ops/cpu/float_io.h"
#include "ops/cpu/level.h"

namespace nk::ops::NK_CPU_NS {

// Grow-only per-thread scratch: no allocation after the first call at a size.
inline float* attention_scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// dst[r*ldd + c] = s * src[r*lds + c] for an rows x cols block.
template <typename T>
void load_rows(float* dst, int64_t ldd, const T* src, int64_t lds, int64_t rows, int64_t cols,
               float s = 1.f) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * ldd + c] = s * load(src[r * lds + c]);
}

// dst[c*ldd + r] = s * src[r*lds + c]: the transpose of an rows x cols block.
template <typename T>
void load_cols(float* dst, int64_t ldd, const T* src, int64_t lds, int64_t rows, int64_t cols,
               float s = 1.f) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = s * load(src[r * lds + c]);
}

}  // namespace nk::ops::NK_CPU_NS
