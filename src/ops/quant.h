// Quantised weights for inference: ggml's block formats (as llama.cpp and
// GGUF files store them, byte for byte) and int8 per output channel.
//
// A weight [out, in] is stored row by row; each row is in / block(type)
// blocks (in must be a multiple of the block), so rows can be permuted,
// split and concatenated as raw bytes. Layouts (little-endian, f16 = IEEE half):
//   Q8_0  32 values, 34 bytes:  f16 d, i8 q[32];             x = d q
//   Q4_0  32 values, 18 bytes:  f16 d, u8 qs[16];            x = d (q - 8),
//         q of value j < 16 is qs[j] & 15, of value j + 16 is qs[j] >> 4
//   Q4_K  256 values, 144 bytes: f16 d, f16 dmin, u8 scales[12], u8 qs[128];
//         8 sub-blocks of 32 with 6-bit scale sc and min m packed in scales
//         (sub-block j < 4: sc = scales[j] & 63, m = scales[j + 4] & 63;
//         j >= 4: sc = (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4,
//         m = (scales[j + 4] >> 4) | (scales[j] >> 6) << 4); x = d sc q - dmin m;
//         value 64 c + i (i < 32) is qs[32 c + i] & 15, value 64 c + 32 + i
//         is qs[32 c + i] >> 4
//   Q6_K  256 values, 210 bytes: u8 ql[128], u8 qh[64], i8 scales[16], f16 d;
//         x = d scales[v / 16] (q - 32), q 6 bits: in each half h (128
//         values; ql + 64 h, qh + 32 h) value 32 k + l (k < 4, l < 32) has
//         low nibble of ql[l + 32 (k & 1)] (k < 2: & 15, else >> 4) and high
//         bits (qh[l] >> 2 k) & 3
//   W8A16, W8A8  int8 per output channel: data i8 [out, in], scale f32 [out]
//         (max |w| of the row / 127, q = round(w / scale)); the two share the
//         storage and differ in the product: W8A16 multiplies x as given,
//         W8A8 quantises each row of x to int8 first (dynamic, per token).
//   F16   IEEE half per value (GGUF's F16 matrices kept at 2 bytes; x as
//         given, as W8A16): data f16 [out, in] as bytes, no scale.
//   BF16  bfloat16 per value, as F16 (`quantize=bf16`: a bf16 model's
//         decode on a CPU without bf16 products, below avx512_bf16, reads
//         its weights in place instead of oneDNN widening them to f32).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace nk::ops {

enum class QuantType : uint8_t { Q8_0, Q4_0, Q4_K, Q6_K, W8A16, W8A8, F16, BF16 };

// How a weight's bytes are ordered in `data`. Rows: row by row, as above (what
// files hold). Packed16 (quant_pack): the same bytes, for rows in groups of
// 16, interleaved so that a kernel reads 16 rows' values with one load: each
// row's bytes are cut into units (a block's f16 scale: 2 bytes; everything
// else: 4-byte words) and the unit at byte o of the 16 rows of group g sits,
// row by row, at byte 16 o of the group (which starts at g 16 row_bytes).
enum class QuantLayout : uint8_t { Rows, Packed16 };

// "q8_0", "q4_0", "q4_k", "q6_k", "w8a16", "w8a8", "f16".
const char* quant_type_name(QuantType t);
// nk::Error listing the names otherwise.
QuantType parse_quant_type(const std::string& s);
// Values per block: 32, 32, 256, 256, 1, 1, 1.
int64_t quant_block(QuantType t);
// Bytes of one row of `in` values in `data` (nk::Error when in is not a
// multiple of the block).
size_t quant_row_bytes(QuantType t, int64_t in);

struct QuantWeight {
  QuantType type = QuantType::Q8_0;
  Shape shape;   // [out, in]
  Tensor data;   // u8 [out * quant_row_bytes(type, in)]
  Tensor scale;  // f32 [out] for W8A16 and W8A8; undefined otherwise
  QuantLayout layout = QuantLayout::Rows;
  // Uninitialised storage (nk::Error naming the shape when it is not 2-d or
  // in is not a multiple of the type's block).
  static QuantWeight empty(QuantType type, const Shape& shape, Device device = kHost);
  bool defined() const { return data.defined(); }
  int64_t rows() const { return shape[0]; }
  int64_t cols() const { return shape[1]; }
  size_t row_bytes() const { return quant_row_bytes(type, cols()); }
  size_t nbytes() const;  // data and scale
};

// q (allocated for w's shape) <- w (f32 [out, in], contiguous) quantised.
// Deterministic. Q8_0: d = max|x| / 127 rounded to f16, q = the nearest
// integer (ties to even) to x (1 / d) with the stored d (|x - d q| <= d / 2); Q4_0 as ggml's
// reference quantiser (d = the value of largest magnitude / -8, q = min(15, trunc(x * (1 / d)
// + 8.5)), the product rounded to f32 first); Q4_K and Q6_K by a search for the scales (and mins)
// that minimise the squared error of each sub-block. A NaN or infinity is an nk::Error naming its
// row and column; q is left as it was.
void quant_quantize(QuantWeight& q, const Tensor& w);
// out (f32 or bf16 [n, in], contiguous) <- rows [row0, row0 + n) of q read
// back in f32 (each value exactly the layout's formula) then rounded to
// out's dtype.
void quant_dequantize(Tensor out, const QuantWeight& q, int64_t row0 = 0);
// Reorders q's bytes in place into the layout its device's kernels read
// fastest, and returns whether it did: on the CPU, Packed16 for the types the
// AVX-512 VNNI tiles serve (q8_0, q4_0, q4_k, q6_k; w8a8 with in a multiple
// of 32) when the build has them and the rows are a multiple of 16; every
// product then takes the tiles, one row of x included. Every op accepts
// both layouts and gives the same values (quant_quantize writes the layout q
// has). A copy of q made before shares its bytes but not its layout: make
// copies after packing. Packing a packed weight does nothing.
bool quant_pack(QuantWeight& q);
// q's weight in the row layout: q itself when it has it, else an unpacked copy.
QuantWeight quant_unpacked(const QuantWeight& q);
// y[N,out] = x[N,in] @ W^T + b, W = q's weight; x, y f32 or bf16 (the same
// dtype), b undefined or of x's dtype. For few rows (decode) the kernel
// reads q's blocks directly; the ggml types and W8A8 quantise x per row
// (8-bit blocks, as llama.cpp's Q8_0 and Q8_K) and sum integer products.
// For more rows, integer tiles of 16 weight rows where the CPU has AVX-512
// VNNI (and for every row count once q is packed), else dequantised panels
// of W and the dense product (ops/cpu/quant_blocks.h: quant_linear_path).
// Equals linear_forward on quant_dequantize(q) within the error of
// quantising x (none for W8A16).
void quant_linear_forward(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b);
// quant_linear_forward over W stored as runs of rows (each its own type,
// concatenated along out): each run writes its columns of y.
void quant_linear_forward_runs(Tensor y, const Tensor& x, const std::vector<QuantWeight>& runs,
                               const Tensor& b);
// Rows [row0, row0 + n) of a weight stored as runs (concatenated along out)
// as runs of their own, sharing the bytes (no copy): a Mixture-of-Experts
// layer's experts are slices of one stacked weight. A packed run
// (QuantLayout::Packed16) is sliced at multiples of 16 rows only
// (nk::Error otherwise, as for a range outside the runs).
std::vector<QuantWeight> quant_slice_rows(const std::vector<QuantWeight>& runs, int64_t row0,
                                          int64_t n);
// out[.., C] <- rows `tokens` (i32) of the table q [V, C] dequantised, in
// out's dtype (f32 or bf16). nk::Error naming a token outside [0, V).
// vocab_start >= 0: wte is one rank's shard of a vocabulary split over
// tensor-parallel ranks (ids [vocab_start, vocab_start + rows)); other ids
// read a zero row (the group's sum completes the lookup), as
// embedding_forward's.
void quant_embedding_forward(Tensor out, const Tensor& tokens, const QuantWeight& wte,
                             int64_t vocab_start = -1);

}  // namespace nk::ops
