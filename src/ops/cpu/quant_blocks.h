// Private to the quantised-weight kernels (cpu/quant*.cc): ggml's block
// structs, byte for byte as ops/quant.h lays them out (GGUF files are read
// straight into them), the 8-bit activation blocks the products quantise x
// into, and the helpers the files share.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/level.h"
#include "ops/cpu_quant_paths.h"
#include "ops/quant.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace nk::ops::NK_CPU_NS {

// ---- weight blocks (ggml's block_q8_0, block_q4_0, block_q4_K, block_q6_K) ----

constexpr int kQK = 32;    // values of a Q8_0 / Q4_0 block
constexpr int kQKK = 256;  // values of a Q4_K / Q6_K super-block

struct BlockQ8_0 {
  uint16_t d;  // f16
  int8_t qs[kQK];
};
struct BlockQ4_0 {
  uint16_t d;           // f16
  uint8_t qs[kQK / 2];  // value j < 16: low nibble of qs[j]; j + 16: high nibble
};
struct BlockQ4_K {
  uint16_t d, dmin;      // f16
  uint8_t scales[12];    // 8 pairs (sc, m) of 6 bits, packed (q4k_scales)
  uint8_t qs[kQKK / 2];  // 64 c + i: low nibble of qs[32 c + i]; 64 c + 32 + i: high
};
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];  // low 4 bits
  uint8_t qh[kQKK / 4];  // high 2 bits
  int8_t scales[kQKK / 16];
  uint16_t d;  // f16
};
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ6_K) == 210);
static_assert(offsetof(BlockQ4_K, qs) == 16 && offsetof(BlockQ6_K, d) == 208);

// f16 <-> f32. The hardware conversion (F16C) is exact, like nk::f16_to_f32;
// quantisers round with nk::f32_to_f16 (nearest even, as F16C and ggml do).
inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return f16_to_f32(f16{h});
#endif
}
inline uint16_t float_to_half(float f) {
  return f32_to_f16(f).bits;
}

// Q8_0 rows of n values (a multiple of kQK; ops/cpu/quant.cc): the scale
// max|x| / 127 rounded to f16, each value the nearest of x / (that scale);
// and back, nb blocks to nb x kQK floats.
void quantize_q8_0(const float* x, int64_t n, BlockQ8_0* y);
void dequant_q8_0(const BlockQ8_0* x, int64_t nb, float* y);

// The 6-bit scale sc[j] and min m[j] of the 8 sub-blocks of a Q4_K block.
struct Q4KScales {
  uint8_t sc[8], m[8];
};
inline Q4KScales q4k_scales(const uint8_t* s) {
  Q4KScales r;
  for (int j = 0; j < 4; ++j) {
    r.sc[j] = s[j] & 63;
    r.m[j] = s[j + 4] & 63;
    r.sc[j + 4] = uint8_t((s[j + 8] & 15) | (s[j] >> 6) << 4);
    r.m[j + 4] = uint8_t((s[j + 8] >> 4) | (s[j + 4] >> 6) << 4);
  }
  return r;
}
// The inverse: sc and m < 64 packed into 12 bytes.
inline void q4k_pack_scales(const Q4KScales& r, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = uint8_t(r.sc[j] | (r.sc[j + 4] >> 4) << 6);
    s[j + 4] = uint8_t(r.m[j] | (r.m[j + 4] >> 4) << 6);
    s[j + 8] = uint8_t((r.sc[j + 4] & 15) | (r.m[j + 4] & 15) << 4);
  }
}

// ---- activation blocks (x quantised per call, quant_dot.cc) ----
//
// A row of x of `in` values quantised to int8 with f32 scales:
//  - blocks of 32 (for Q8_0 and Q4_0 weights), as llama.cpp's Q8_0 but with
//    an f32 scale: d[b] = max |x| / 127 over the block, q = nearest-even
//    rounding of x / d[b] (0 where d[b] = 0; d[b] = NaN and q = 0 where the
//    block holds a NaN or infinity, so that y is not finite either);
//  - blocks of 256 (for Q4_K and Q6_K), as llama.cpp's Q8_K: the same rule
//    per 256 values, plus sums[16 b + k] = the sum of q over values
//    [16 k, 16 k + 16) of the block;
//  - one block of `in` (W8A8): a per-row scale.
// Beside q the products keep what each weight type's inner loop wants
// precomputed once per x row rather than once per weight row: |q| (for
// signed-by-signed products through maddubs), and for Q4_0 (two blocks a
// step: values j < 16 of both in one register, then values j >= 16) q with
// blocks 2p and 2p + 1 interleaved by halves, and the offset term
// 8 (q[2i] + q[2i+1] + q[16+2i] + q[17+2i]) of each block.
struct QuantRow {
  int8_t* q;       // [in]
  uint8_t* aq;     // [in] |q|, Q8_0 and W8A8
  int8_t* qpair;   // [in] per 64 values: b lo, b+1 lo, b hi, b+1 hi (16 each), Q4_0
  int16_t* quad8;  // [in / 4] per block 8 offsets, Q4_0
  int16_t* sums;   // [in / 16] sums of 16, Q4_K and Q6_K
  float* d;        // [in / block] block scales
};

// A 64-byte aligned array of `count` T in `buf`, grown as needed and never
// shrunk, so a call of a size seen before allocates nothing.
template <typename T>
T* scratch(std::vector<char>& buf, size_t count) {
  const size_t bytes = count * sizeof(T) + 64;
  if (buf.size() < bytes) buf.resize(bytes);
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<T*>((p + 63) & ~uintptr_t(63));
}

// y's side of a product y[N, out] (T = f32 or bf16): the W8 row scales, the
// bias (undefined, f32 or T) and one rounding to T, for the direct kernel and
// the VNNI tiles alike.
template <typename T>
struct QuantOut {
  T* y;
  int64_t out;
  const float* wscale;  // W8 row scales, or null
  const float* bias_f32;
  const T* bias_t;
  QuantOut(Tensor& yt, const QuantWeight& w, const Tensor& b)
      : y(yt.data<T>()),
        out(w.rows()),
        wscale(w.scale.defined() ? w.scale.data<float>() : nullptr),
        bias_f32(b.defined() && b.dtype() == DType::F32 ? b.data<float>() : nullptr),
        bias_t(b.defined() && b.dtype() != DType::F32 ? b.data<T>() : nullptr) {}
  void store(int64_t n, int64_t o, float v) const {
    if (wscale) v *= wscale[o];
    if (bias_f32) v += bias_f32[o];
    if (bias_t) v += load(bias_t[o]);
    y[n * out + o] = NK_CPU_NS::store<T>(v);
  }
};

// ---- entry points between the kernel files ----

// q[0, n) <- x quantised to int8 with one scale d (returned): d = max |x| /
// 127, q the nearest-even rounding of x / d (0 where d = 0); a NaN or
// infinity in x gives d = NaN and q = 0, so products stay non-finite.
float quantize_x_block(const float* x, int64_t n, int8_t* q);
// x ([.., k], f32 or bf16) as f32: its data, or its values widened into buf.
const float* rows_as_f32(const Tensor& x, std::vector<char>& buf);

// values [0, n) of one row of q's weight (row bytes at `row`), in f32 exactly
// as the layout defines them; `scale` is the row's scale for W8A16/W8A8.
void quant_dequant_row(QuantType t, const uint8_t* row, float scale, int64_t n, float* out);

// ---- the packed layout (QuantLayout::Packed16, ops/quant.h) ----

constexpr int64_t kPackRows = 16;
// Bytes of the unit at byte `off` of a row of type t: 2 for a block's f16
// scale (Q8_0 and Q4_0: the block's first two bytes, Q6_K: its last two),
// 4 for everything else.
inline size_t packed_unit(QuantType t, size_t off) {
  switch (t) {
    case QuantType::Q8_0:
      return off % sizeof(BlockQ8_0) < 2 ? 2 : 4;
    case QuantType::Q4_0:
      return off % sizeof(BlockQ4_0) < 2 ? 2 : 4;
    case QuantType::Q6_K:
      return off % sizeof(BlockQ6_K) >= offsetof(BlockQ6_K, d) ? 2 : 4;
    default:
      return 4;
  }
}
// Row r of q in the row layout: a pointer into q.data, or, for a packed q,
// its bytes gathered into buf (grown to row_bytes).
const uint8_t* quant_row(const QuantWeight& q, int64_t r, std::vector<uint8_t>& buf);

// The paths of quant_linear_forward (also called by bench_quant's
// --sweep, which times them apart to place the threshold). y[N, out] =
// x[N, in] W^T + b; x and y f32 or bf16 (y x's dtype), b undefined, f32 or
// x's dtype. Direct: reads W's blocks (quant_dot.cc); panels: dequantises
// panels of W and runs oneDNN's product (quant_linear.cc).
void quant_linear_direct(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b);
void quant_linear_panels(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b);
// The third, for many rows where the build targets AVX-512 VNNI
// (quant_gemm.cc): W unpacked once per call into byte tiles of 16 rows and
// summed with vpdpbusd, x quantised to 8 bits in blocks of 32 (W8A8: per
// row).
// quant_gemm_available says whether it serves type t at width in (false in
// builds without VNNI, where quant_linear_gemm is an nk::Error).
bool quant_gemm_available(QuantType t, int64_t in);
void quant_linear_gemm(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b);
// The path quant_linear_forward takes for n rows of x against a weight of
// type t and width in.
// (A packed weight takes the tiles for every n.)
// (QuantPath: ops/cpu_quant_paths.h, shared by the levels' tables.)
QuantPath quant_linear_path(QuantType t, int64_t in, int64_t n,
                            QuantLayout layout = QuantLayout::Rows);

}  // namespace nk::ops::NK_CPU_NS
