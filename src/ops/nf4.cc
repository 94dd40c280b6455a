// NF4 weights (QLoRA): the level tables, Nf4Weight's storage, and the ops'
// checks before the device's kernel. The ops are listed by hand rather than
// through NK_KERNEL: only the CPU has them, so another device gets the
// "no kernel" error naming the op until its backend adds one here.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/dispatch.h"
#include "ops/ops.h"
#include "ops/shapes.h"

namespace nk::ops {

// The 16 NormalFloat levels of QLoRA (Dettmers et al., 2023), as f32: the
// quantiles of N(0, 1) scaled to [-1, 1], with an exact 0 (index 7).
const float kNf4Levels[16] = {-1.0f,
                              -0.6961928009986877f,
                              -0.5250730514526367f,
                              -0.39491748809814453f,
                              -0.28444138169288635f,
                              -0.18477343022823334f,
                              -0.09105003625154495f,
                              0.0f,
                              0.07958029955625534f,
                              0.16093020141124725f,
                              0.24611230194568634f,
                              0.33791524171829224f,
                              0.44070982933044434f,
                              0.5626170039176941f,
                              0.7229568362236023f,
                              1.0f};

namespace {

// x rounded to double on its own: GCC (gnu++20) would otherwise fuse a
// product into the following sum (one FMA), and the table must be what the
// definition's separately rounded operations give.
double rounded(double x) {
  volatile double r = x;
  return r;
}

std::array<float, 256> build_dynamic_levels() {
  std::vector<double> v;
  for (int i = 0; i < 7; ++i) {
    // linspace(0.1, 1, k + 1) as numpy computes it: j * step + 0.1, the last exactly 1.
    const int k = 1 << i;
    const double step = (1.0 - 0.1) / k, unit = std::pow(10.0, double(i - 6));
    std::vector<double> b(size_t(k) + 1);
    for (int j = 0; j < k; ++j) b[size_t(j)] = rounded(double(j) * step) + 0.1;
    b[size_t(k)] = 1.0;
    for (int j = 0; j < k; ++j) {
      const double mean = (b[size_t(j)] + b[size_t(j) + 1]) / 2.0;
      v.push_back(unit * mean);
      v.push_back(-(unit * mean));
    }
  }
  v.push_back(0.0);
  v.push_back(1.0);
  // 127 positive means, their 127 negations, 0 and 1.
  NK_CHECK(v.size() == 256, "nf4 dynamic map: {} levels", v.size());
  std::array<float, 256> out;
  for (size_t i = 0; i < v.size(); ++i) out[i] = float(v[i]);
  std::sort(out.begin(), out.end());
  for (size_t i = 1; i < out.size(); ++i)
    NK_CHECK(out[i - 1] < out[i], "nf4 dynamic map: levels {} and {} are not distinct", i - 1, i);
  return out;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// q's four tensors have the sizes and dtypes of a weight of q.shape and
// share one device, which is returned. `name` is the op's name for q.
Device check_nf4(const char* op, const Nf4Weight& q, const char* name) {
  NK_CHECK(q.defined(), "{}: {} is an undefined NF4 weight", op, name);
  const int64_t n = q.numel(), blocks = ceil_div(n, kNf4Block);
  NK_CHECK(n > 0, "{}: {} has shape {}", op, name, shape_str(q.shape));
  NK_CHECK(q.scale_block >= 1 && q.scale_block <= kNf4ScaleBlock &&
               std::has_single_bit(uint64_t(q.scale_block)),
           "{}: {} has a scale block of {} blocks", op, name, q.scale_block);
  const Device dev = device_of(op, {{&q.codes, "codes"},
                                    {&q.absmax_codes, "absmax_codes"},
                                    {&q.absmax_scale, "absmax_scale"},
                                    {&q.absmax_offset, "absmax_offset"}});
  const struct {
    const Tensor& t;
    DType dtype;
    int64_t numel;
    const char* part;
  } parts[] = {{q.codes, DType::U8, ceil_div(n, 2), "codes"},
               {q.absmax_codes, DType::U8, blocks, "absmax_codes"},
               {q.absmax_scale, DType::F32, ceil_div(blocks, q.scale_block), "absmax_scale"},
               {q.absmax_offset, DType::F32, 1, "absmax_offset"}};
  for (const auto& p : parts)
    NK_CHECK(p.t.dtype() == p.dtype && p.t.ndim() == 1 && p.t.numel() == p.numel,
             "{}: {}.{} is {}, expected {}[{}] for an NF4 weight of shape {}", op, name, p.part,
             p.t.desc(), dtype_name(p.dtype), p.numel, shape_str(q.shape));
  return dev;
}

// An NF4 linear weight [out, in].
void check_nf4_matrix(const char* op, const Nf4Weight& w) {
  NK_CHECK(w.shape.size() == 2, "{}: w has shape {}, expected [out, in]", op, shape_str(w.shape));
}

}  // namespace

const float* nf4_dynamic_levels() {
  static const std::array<float, 256> levels = build_dynamic_levels();
  return levels.data();
}

Nf4Weight Nf4Weight::empty(const Shape& shape, Device device, int64_t scale_block) {
  for (int64_t d : shape)
    NK_CHECK(d > 0, "Nf4Weight::empty: shape {} has an empty dimension", shape_str(shape));
  NK_CHECK(scale_block >= 1 && scale_block <= kNf4ScaleBlock &&
               std::has_single_bit(uint64_t(scale_block)),
           "Nf4Weight::empty: a scale block of {} blocks", scale_block);
  Nf4Weight q;
  q.shape = shape;
  q.scale_block = scale_block;
  const int64_t n = shape_numel(shape), blocks = ceil_div(n, kNf4Block);
  q.codes = Tensor::empty({ceil_div(n, 2)}, DType::U8, device);
  q.absmax_codes = Tensor::empty({blocks}, DType::U8, device);
  q.absmax_scale = Tensor::empty({ceil_div(blocks, scale_block)}, DType::F32, device);
  q.absmax_offset = Tensor::empty({1}, DType::F32, device);
  return q;
}

Nf4Weight Nf4Weight::first_rows(int64_t rows) const {
  NK_CHECK(shape.size() == 2 && rows > 0 && rows <= shape[0],
           "Nf4Weight::first_rows: {} rows of a weight of shape {}", rows, shape_str(shape));
  Nf4Weight q = *this;
  q.shape = {rows, shape[1]};
  const int64_t n = q.numel(), blocks = ceil_div(n, kNf4Block);
  q.codes = codes.narrow0(0, ceil_div(n, 2));  // (an odd count's last low nibble is not read)
  q.absmax_codes = absmax_codes.narrow0(0, blocks);
  q.absmax_scale = absmax_scale.narrow0(0, ceil_div(blocks, scale_block));
  return q;
}

size_t Nf4Weight::nbytes() const {
  return codes.nbytes() + absmax_codes.nbytes() + absmax_scale.nbytes() + absmax_offset.nbytes();
}

void nf4_quantize(Nf4Weight& q, const Tensor& w) {
  const char* op = "nf4_quantize";
  const Device dev = check_nf4(op, q, "q");
  NK_CHECK(q.scale_block == kNf4ScaleBlock, "{}: q has a shard's scale block of {} blocks", op,
           q.scale_block);
  NK_CHECK(w.defined() && w.shape() == q.shape, "{}: w is {} but q was made for shape {}", op,
           w.defined() ? w.desc() : "undefined", shape_str(q.shape));
  check_dtype(w, DType::F32, "nf4_quantize w");
  device_of(op, {{&q.codes, "q"}, {&w, "w"}});
  pick_kernel(op, dev, cpu_kernels().nf4_quantize)(q, w);
}

void nf4_dequantize(Tensor out, const Nf4Weight& q, int64_t start) {
  const char* op = "nf4_dequantize";
  const Device dev = check_nf4(op, q, "q");
  device_of(op, {{&q.codes, "q"}, {&out, "out"}});
  NK_CHECK(is_compute_dtype(out.dtype()), "{}: out is {}, expected f32 or bf16", op, out.desc());
  NK_CHECK(start >= 0 && start + out.numel() <= q.numel(),
           "{}: out {} from start {} is outside the weight's {} values", op, out.desc(), start,
           q.numel());
  if (out.numel() == 0) return;
  pick_kernel(op, dev, cpu_kernels().nf4_dequantize)(out, q, start);
}

int64_t nf4_pieces_misaligned(const std::vector<Nf4Piece>& pieces) {
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Nf4Piece& p = pieces[i];
    if ((p.start >= 0 && p.start % kNf4Block) || (i + 1 < pieces.size() && p.len % kNf4Block))
      return int64_t(i);
  }
  return -1;
}

namespace {

// The whole weight's block behind each of the shard's blocks (-1: zeros).
std::vector<int64_t> shard_blocks(const std::vector<Nf4Piece>& pieces) {
  NK_CHECK(nf4_pieces_misaligned(pieces) < 0, "nf4 shard: piece {} is not whole blocks",
           nf4_pieces_misaligned(pieces));
  std::vector<int64_t> out;
  for (const Nf4Piece& p : pieces) {
    NK_CHECK(p.len > 0, "nf4 shard: a piece of {} values", p.len);
    for (int64_t j = 0; j < ceil_div(p.len, kNf4Block); ++j)
      out.push_back(p.start < 0 ? -1 : p.start / kNf4Block + j);
  }
  return out;
}

// The whole weight's scale block of each of the shard's scale blocks of
// `size` blocks (-1: zeros only), or nothing if one draws from two.
std::vector<int64_t> scale_sources(const std::vector<int64_t>& blocks, int64_t size) {
  std::vector<int64_t> out;
  for (size_t s = 0; s < blocks.size(); s += size_t(size)) {
    int64_t src = -1;
    for (size_t j = s; j < std::min(blocks.size(), s + size_t(size)); ++j) {
      if (blocks[j] < 0) continue;
      const int64_t g = blocks[j] / kNf4ScaleBlock;
      if (src >= 0 && g != src) return {};
      src = g;
    }
    out.push_back(src);
  }
  return out;
}

}  // namespace

int64_t nf4_shard_scale_block(const std::vector<Nf4Piece>& pieces) {
  NK_CHECK(nf4_pieces_misaligned(pieces) < 0, "nf4 shard: piece {} is not whole blocks",
           nf4_pieces_misaligned(pieces));
  // Each shard block whose whole scale block is not that of the last block
  // from the whole before it (zero blocks join any) must start a scale
  // block of the shard after that one: a multiple of `size` in (last, here].
  // O(pieces): inside a piece such blocks are 256 apart, so the first (or,
  // at the piece's start, the next) has the low bits of all of them.
  int64_t size = kNf4ScaleBlock, at = 0, last = -1, last_group = -1;
  auto apart = [&](int64_t before, int64_t here) {
    while (size > 1 && before / size == here / size) size /= 2;
  };
  for (const Nf4Piece& p : pieces) {
    const int64_t m = ceil_div(p.len, kNf4Block);
    if (p.start >= 0) {
      const int64_t w = p.start / kNf4Block;  // the piece's first block of the whole
      if (last >= 0 && w / kNf4ScaleBlock != last_group) apart(last, at);
      const int64_t j = (kNf4ScaleBlock - w % kNf4ScaleBlock) % kNf4ScaleBlock;
      for (int64_t i : {j, j + kNf4ScaleBlock})
        if (i > 0 && i < m) apart(at + i - 1, at + i);
      last = at + m - 1;
      last_group = (w + m - 1) / kNf4ScaleBlock;
    }
    at += m;
  }
  return size;
}

void nf4_take_shard(Nf4Weight& shard, const Nf4Weight& whole, const std::vector<Nf4Piece>& pieces) {
  const char* op = "nf4_take_shard";
  NK_CHECK(check_nf4(op, whole, "whole") == kHost && check_nf4(op, shard, "shard") == kHost,
           "{}: NF4 weights on the host only", op);
  NK_CHECK(whole.scale_block == kNf4ScaleBlock, "{}: whole is itself a shard", op);
  const std::vector<int64_t> blocks = shard_blocks(pieces);
  const std::vector<int64_t> scales = scale_sources(blocks, shard.scale_block);
  int64_t values = 0;
  for (const Nf4Piece& p : pieces) {
    NK_CHECK(p.start < 0 || p.start + p.len <= whole.numel(),
             "{}: piece [{}, {}) outside the whole weight's {} values", op, p.start,
             p.start + p.len, whole.numel());
    values += p.len;
  }
  NK_CHECK(values == shard.numel() && !scales.empty(),
           "{}: pieces of {} values for a shard of {} values, scale block {}", op, values,
           shard.numel(), shard.scale_block);
  // Codes: whole bytes (a piece starts on a block, so on a byte); 7 is 0.0.
  constexpr uint8_t kZeroPair = 7 << 4 | 7;
  const uint8_t* src = whole.codes.data<uint8_t>();
  uint8_t* dst = shard.codes.data<uint8_t>();
  int64_t at = 0;
  for (const Nf4Piece& p : pieces) {
    const size_t bytes = size_t(ceil_div(p.len, 2));
    if (p.start < 0)
      std::memset(dst + at / 2, kZeroPair, bytes);
    else
      std::memcpy(dst + at / 2, src + p.start / 2, bytes);
    at += p.len;
  }
  if (at & 1) dst[at / 2] &= 0xF0;  // an odd count's pad nibble is 0
  // Absmax codes (a zero block's: the dynamic level 0.0, so its absmax is
  // the offset and its values +0.0) and the scales.
  const float* dyn = nf4_dynamic_levels();
  const uint8_t dyn_zero = uint8_t(std::find(dyn, dyn + 256, 0.f) - dyn);
  const uint8_t* acodes = whole.absmax_codes.data<uint8_t>();
  uint8_t* out_codes = shard.absmax_codes.data<uint8_t>();
  for (size_t b = 0; b < blocks.size(); ++b)
    out_codes[b] = blocks[b] < 0 ? dyn_zero : acodes[blocks[b]];
  const float* scale = whole.absmax_scale.data<float>();
  for (size_t s = 0; s < scales.size(); ++s)
    shard.absmax_scale.data<float>()[s] = scales[s] < 0 ? 0.f : scale[scales[s]];
  shard.absmax_offset.data<float>()[0] = whole.absmax_offset.data<float>()[0];
}

void nf4_linear_forward(Tensor y, const Tensor& x, const Nf4Weight& w, const Tensor& b) {
  const char* op = "nf4_linear_forward";
  const Device dev = check_nf4(op, w, "w");
  check_nf4_matrix(op, w);
  device_of(op, {{&w.codes, "w"}, {&y, "y"}, {&x, "x"}, {&b, "b", kOptional}});
  const int64_t out = w.shape[0], in = w.shape[1];
  NK_CHECK(is_compute_dtype(x.dtype()), "{}: x is {}, expected f32 or bf16", op, x.desc());
  const int64_t n = rows_checked(op, x, in, "x");
  NK_CHECK(rows_checked(op, y, out, "y") == n, "{}: y {} does not match x {}", op, y.desc(),
           x.desc());
  check_dtype(y, x.dtype(), "nf4_linear_forward y");
  if (b.defined()) {
    check_shape(b, {out}, "nf4_linear_forward b");
    NK_CHECK(b.dtype() == x.dtype() || b.dtype() == DType::F32, "{}: b is {}", op, b.desc());
  }
  if (n == 0) return;
  pick_kernel(op, dev, cpu_kernels().nf4_linear_forward)(y, x, w, b);
}

void nf4_linear_backward_input(Tensor dx, const Tensor& dy, const Nf4Weight& w) {
  const char* op = "nf4_linear_backward_input";
  const Device dev = check_nf4(op, w, "w");
  check_nf4_matrix(op, w);
  device_of(op, {{&w.codes, "w"}, {&dx, "dx"}, {&dy, "dy"}});
  const int64_t out = w.shape[0], in = w.shape[1];
  NK_CHECK(is_compute_dtype(dy.dtype()), "{}: dy is {}, expected f32 or bf16", op, dy.desc());
  const int64_t n = rows_checked(op, dy, out, "dy");
  NK_CHECK(rows_checked(op, dx, in, "dx") == n, "{}: dx {} does not match dy {}", op, dx.desc(),
           dy.desc());
  check_dtype(dx, dy.dtype(), "nf4_linear_backward_input dx");
  if (n == 0) return;
  pick_kernel(op, dev, cpu_kernels().nf4_linear_backward_input)(dx, dy, w);
}

void nf4_embedding_forward(Tensor out, const Tensor& tokens, const Nf4Weight& wte,
                           const Tensor& wpe, const Tensor& positions, int64_t vocab_start) {
  const char* op = "nf4_embedding_forward";
  const Device dev = check_nf4(op, wte, "wte");
  NK_CHECK(wte.shape.size() == 2, "{}: wte has shape {}, expected [V, C]", op,
           shape_str(wte.shape));
  device_of(op, {{&wte.codes, "wte"},
                 {&out, "out"},
                 {&tokens, "tokens"},
                 {&wpe, "wpe", kOptional},
                 {&positions, "positions", kOptional}});
  check_dtype(tokens, DType::I32, "tokens");
  NK_CHECK(tokens.ndim() == 2, "{}: tokens {} is not [B, T]", op, tokens.desc());
  if (positions.defined()) {
    check_dtype(positions, DType::I32, "positions");
    check_shape(positions, tokens.shape(), "positions");
  }
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = wte.shape[1];
  check_shape(out, {B, T, C}, "out");
  NK_CHECK(is_compute_dtype(out.dtype()), "{}: out is {}, expected f32 or bf16", op, out.desc());
  if (wpe.defined()) {  // explicit positions are checked against its rows by the kernel
    const int64_t min_rows = positions.defined() ? 0 : T;
    NK_CHECK(wpe.ndim() == 2 && wpe.dim(1) == C && wpe.dim(0) >= min_rows,
             "{}: wpe {} does not cover {} rows of C={}", op, wpe.desc(), min_rows, C);
    check_dtype(wpe, out.dtype(), "wpe");
  }
  if (out.numel() == 0) return;
  pick_kernel(op, dev, cpu_kernels().nf4_embedding_forward)(out, tokens, wte, wpe, positions,
                                                            vocab_start);
}

}  // namespace nk::ops
