// NF4 kernels on the CPU (arguments checked by ops/nf4.cc; the format is in
// ops.h). The two products never hold the dense weight: they dequantise a
// panel of it (~kPanelBytes) at a time into a scratch buffer and run oneDNN's
// product on it. The scratch buffers live here, grown to the largest panel and
// never shrunk, so a training step allocates nothing after the first; like
// dnnl_matmul these ops are called from one thread at a time.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "ops/cpu/dnnl_matmul.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"
#include "ops/ops.h"

namespace nk::ops::NK_CPU_NS {
namespace {

constexpr uint8_t kZeroCode = 7;       // kNf4Levels[7] == 0
constexpr uint8_t kDynZeroCode = 127;  // 127 negative dynamic levels, then 0
// Target size of a dequantised panel: it stays in cache while oneDNN packs
// it. (On a 2-core AVX2 machine 1 MiB timed as well as 2 MiB for the forward
// and better for the backward's column panels in bf16; bench/bench_nf4.cc.)
constexpr size_t kPanelBytes = size_t(1) << 20;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The midpoints between neighbouring levels, in double, where they are exact:
// neighbours are a few binades apart at most, or one of them is 0.
template <size_t L>
std::array<double, L - 1> midpoints(const float* levels) {
  std::array<double, L - 1> m;
  for (size_t i = 0; i + 1 < L; ++i) m[i] = (double(levels[i]) + double(levels[i + 1])) / 2;
  return m;
}

// The index of the level nearest to x, the lower one when x lies exactly
// between two: the first midpoint >= x.
template <size_t M>
uint8_t nearest(const std::array<double, M>& mids, float x) {
  return uint8_t(std::lower_bound(mids.begin(), mids.end(), double(x)) - mids.begin());
}

const std::array<double, 15>& nf4_midpoints() {
  static const auto m = midpoints<16>(kNf4Levels);
  return m;
}

const std::array<double, 255>& dynamic_midpoints() {
  static const auto m = midpoints<256>(nf4_dynamic_levels());
  return m;
}

// An Nf4Weight's storage, for reading values back.
struct Nf4View {
  const uint8_t* codes;
  const uint8_t* acodes;
  const float* scale;
  const float* dyn;
  float offset;
  int scale_shift;  // log2 of the blocks per scale (a power of two: check_nf4)

  explicit Nf4View(const Nf4Weight& q)
      : codes(q.codes.data<uint8_t>()),
        acodes(q.absmax_codes.data<uint8_t>()),
        scale(q.absmax_scale.data<float>()),
        dyn(nf4_dynamic_levels()),
        offset(q.absmax_offset.data<float>()[0]),
        scale_shift(std::countr_zero(uint64_t(q.scale_block))) {}

  // dyn[acode] * scale + offset, the product rounded to f32 before the sum
  // (volatile: GCC would otherwise fuse the two into an FMA, and the value is
  // defined bit for bit).
  float block_absmax(int64_t b) const {
    volatile float p = dyn[acodes[b]] * scale[b >> scale_shift];
    return p + offset;
  }
};

// out[0, count) <- values [start, start + count) of the weight, in one thread.
template <typename T>
void dequant_serial(const Nf4View& q, int64_t start, int64_t count, T* out) {
  const int64_t end = start + count;
  for (int64_t i = start; i < end;) {
    const int64_t b = i / kNf4Block, stop = std::min(end, (b + 1) * kNf4Block);
    const float a = q.block_absmax(b);
    T lv[16];
    for (int c = 0; c < 16; ++c) lv[c] = store<T>(kNf4Levels[c] * a);
    T* o = out + (i - start);
    if (i & 1) {  // the low nibble of a byte (only at `start`: blocks begin on a byte)
      *o++ = lv[q.codes[i >> 1] & 15];
      ++i;
    }
    for (; i + 2 <= stop; i += 2, o += 2) {
      const uint8_t c = q.codes[i >> 1];
      o[0] = lv[c >> 4];
      o[1] = lv[c & 15];
    }
    if (i < stop) *o = lv[q.codes[i++ >> 1] >> 4];
  }
}

// The same over the threads, split on block edges.
template <typename T>
void dequant_parallel(const Nf4View& q, int64_t start, int64_t count, T* out) {
  const int64_t b0 = start / kNf4Block, b1 = ceil_div(start + count, kNf4Block);
  parallel_for(b1 - b0, 16, [&](int64_t j0, int64_t j1) {
    const int64_t lo = std::max(start, (b0 + j0) * kNf4Block);
    const int64_t hi = std::min(start + count, (b0 + j1) * kNf4Block);
    dequant_serial(q, lo, hi - lo, out + (lo - start));
  });
}

// A 64-byte aligned buffer of `count` T kept in `buf` between calls.
template <typename T>
T* scratch(std::vector<char>& buf, int64_t count) {
  const size_t bytes = size_t(count) * sizeof(T) + 64;
  if (buf.size() < bytes) buf.resize(bytes);
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<T*>((p + 63) & ~uintptr_t(63));
}

std::vector<char> g_nf4_panel, g_nf4_product;  // the dequantised panel; its product

// Lines of a panel (rows or columns of W) of `line_bytes` each: a multiple of
// kNf4Block near kPanelBytes, at least kNf4Block, at most `lines`.
int64_t panel_lines(int64_t lines, int64_t line_bytes) {
  const int64_t fit = int64_t(kPanelBytes) / line_bytes / kNf4Block * kNf4Block;
  return std::min(lines, std::max(kNf4Block, fit));
}

// dst[r, col0 : col0 + w] = src[r, :] for r < n; src [n, w], dst [n, ld].
template <typename T>
void copy_columns_into(T* dst, int64_t ld, int64_t col0, const T* src, int64_t n, int64_t w) {
  parallel_for(n, std::max<int64_t>(1, 16384 / w), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      std::memcpy(dst + r * ld + col0, src + r * w, size_t(w) * sizeof(T));
  });
}

// y[N,out] = x[N,in] @ W^T + b by panels of W's rows.
template <typename T>
void linear_fwd(Tensor y, const Tensor& x, const Nf4Weight& w, const Tensor& b) {
  const int64_t out = w.shape[0], in = w.shape[1], n = rows_of(x);
  const Nf4View q(w);
  const DType t = x.dtype();
  const int64_t rows = panel_lines(out, in * int64_t(sizeof(T)));
  T* panel = scratch<T>(g_nf4_panel, rows * in);
  T* prod = rows < out ? scratch<T>(g_nf4_product, n * rows) : y.data<T>();
  for (int64_t o0 = 0; o0 < out; o0 += rows) {
    const int64_t p = std::min(rows, out - o0);
    dequant_parallel(q, o0 * in, p * in, panel);
    MatmulSpec s{.m = n, .n = p, .k = in, .a = t, .b = t, .c = t};
    s.trans_b = true;  // the panel [p, in] read as [in, p]
    const void* bias = nullptr;
    if (b.defined()) {  // added inside the product, so y is rounded once, as in linear_forward
      s.has_bias = true;
      s.bias = b.dtype();
      bias = static_cast<const char*>(b.raw()) + o0 * int64_t(dtype_size(b.dtype()));
    }
    dnnl_matmul(s, x.raw(), panel, prod, bias);
    if (prod != y.data<T>()) copy_columns_into(y.data<T>(), out, o0, prod, n, p);
  }
}

// dx[N,in] = dy[N,out] @ W by panels of W's columns: each panel's product is
// its own columns of dx, so nothing accumulates across panels.
template <typename T>
void linear_bwd_input(Tensor dx, const Tensor& dy, const Nf4Weight& w) {
  const int64_t out = w.shape[0], in = w.shape[1], n = rows_of(dy);
  const Nf4View q(w);
  const DType t = dy.dtype();
  const int64_t cols = panel_lines(in, out * int64_t(sizeof(T)));
  T* panel = scratch<T>(g_nf4_panel, out * cols);
  T* prod = cols < in ? scratch<T>(g_nf4_product, n * cols) : dx.data<T>();
  for (int64_t k0 = 0; k0 < in; k0 += cols) {
    const int64_t kb = std::min(cols, in - k0);
    parallel_for(out, std::max<int64_t>(1, 4096 / kb), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) dequant_serial(q, r * in + k0, kb, panel + r * kb);
    });
    MatmulSpec s{.m = n, .n = kb, .k = out, .a = t, .b = t, .c = t};
    dnnl_matmul(s, dy.raw(), panel, prod);
    if (prod != dx.data<T>()) copy_columns_into(dx.data<T>(), in, k0, prod, n, kb);
  }
}

// out[n,:] = dequantised wte[tok[n] - v0,:] rounded to T (+ wpe[pos(n),:],
// added in f32 and rounded again): embedding_forward on the table in T. An
// id outside [v0, v0 + V) (another vocabulary shard's) reads zeros.
template <typename T>
void embedding_fwd(T* out, const int32_t* tok, const Nf4Weight& wte, const T* wpe,
                   const int32_t* pos, int64_t rows, int64_t T_len, int64_t v0) {
  const int64_t C = wte.shape[1], V = wte.shape[0];
  const Nf4View q(wte);
  parallel_for(rows, std::max<int64_t>(1, 8192 / C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* o = out + r * C;
      const int64_t id = int64_t(tok[r]) - v0;
      const T* p = wpe ? wpe + (pos ? int64_t(pos[r]) : r % T_len) * C : nullptr;
      if (id < 0 || id >= V) {
        for (int64_t c = 0; c < C; ++c) o[c] = p ? p[c] : store<T>(0.f);
        continue;
      }
      dequant_serial(q, id * C, C, o);
      if (!p) continue;
      for (int64_t c = 0; c < C; ++c) o[c] = store<T>(load(o[c]) + load(p[c]));
    }
  });
}

}  // namespace

void nf4_quantize(Nf4Weight& q, const Tensor& w) {
  const int64_t n = w.numel(), blocks = ceil_div(n, kNf4Block);
  const float* src = w.data<float>();
  uint8_t* codes = q.codes.data<uint8_t>();
  const auto& mids = nf4_midpoints();
  // Block absmaxes in f32; NaN marks a block holding a NaN or an infinity.
  // Nothing is written to q before every block is known to be finite.
  std::vector<float> absmax(size_t(blocks), 0.f);
  parallel_for(blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float a = 0.f;
      bool finite = true;
      for (int64_t i = b * kNf4Block; i < std::min(n, (b + 1) * kNf4Block); ++i) {
        a = std::max(a, std::fabs(src[i]));
        finite &= std::isfinite(src[i]);
      }
      absmax[size_t(b)] = finite ? a : NAN;
    }
  });
  for (int64_t b = 0; b < blocks; ++b) {
    if (!std::isnan(absmax[size_t(b)])) continue;
    int64_t i = b * kNf4Block;
    while (std::isfinite(src[i])) ++i;
    fail("nf4_quantize: the weight {} has the non-finite value {} at flat index {}",
         shape_str(w.shape()), src[i], i);
  }
  parallel_for(blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t i0 = b * kNf4Block, i1 = std::min(n, i0 + kNf4Block);
      const float a = absmax[size_t(b)];
      // Two codes a byte, the first high; the pad nibble of an odd count is 0.
      auto code = [&](int64_t i) -> uint8_t {
        return i >= i1 ? 0 : a > 0.f ? nearest(mids, src[i] / a) : kZeroCode;
      };
      for (int64_t i = i0; i < i1; i += 2) codes[i >> 1] = uint8_t(code(i) << 4 | code(i + 1));
    }
  });
  // Double quantisation. offset: the mean of the absmaxes, summed in order in
  // double and rounded to f32 once (so it is the same on every machine).
  double sum = 0;
  for (float a : absmax) sum += a;
  const float offset = float(sum / double(blocks));
  const auto& dmids = dynamic_midpoints();
  uint8_t* acodes = q.absmax_codes.data<uint8_t>();
  float* scale = q.absmax_scale.data<float>();
  parallel_for(q.absmax_scale.numel(), 4, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t j0 = s * kNf4ScaleBlock, j1 = std::min(blocks, j0 + kNf4ScaleBlock);
      float m = 0.f;  // max |absmax - offset| over the scale block
      for (int64_t j = j0; j < j1; ++j) m = std::max(m, std::fabs(absmax[size_t(j)] - offset));
      for (int64_t j = j0; j < j1; ++j)
        acodes[j] = m > 0.f ? nearest(dmids, (absmax[size_t(j)] - offset) / m) : kDynZeroCode;
      scale[s] = m;
    }
  });
  q.absmax_offset.data<float>()[0] = offset;
}

void nf4_dequantize(Tensor out, const Nf4Weight& q, int64_t start) {
  const Nf4View v(q);
  if (out.dtype() == DType::F32)
    dequant_parallel(v, start, out.numel(), out.data<float>());
  else
    dequant_parallel(v, start, out.numel(), out.data<bf16>());
}

void nf4_linear_forward(Tensor y, const Tensor& x, const Nf4Weight& w, const Tensor& b) {
  if (x.dtype() == DType::F32)
    linear_fwd<float>(y, x, w, b);
  else
    linear_fwd<bf16>(y, x, w, b);
}

void nf4_linear_backward_input(Tensor dx, const Tensor& dy, const Nf4Weight& w) {
  if (dy.dtype() == DType::F32)
    linear_bwd_input<float>(dx, dy, w);
  else
    linear_bwd_input<bf16>(dx, dy, w);
}

void nf4_embedding_forward(Tensor out, const Tensor& tokens, const Nf4Weight& wte,
                           const Tensor& wpe, const Tensor& positions, int64_t vocab_start) {
  const int64_t B = tokens.dim(0), T = tokens.dim(1), V = wte.shape[0];
  // Ids come from data files: a bad one is the user's error (embedding_forward's
  // message; a shard sees ids of the whole vocabulary: only negative ones are wrong).
  const int32_t* tok = tokens.data<int32_t>();
  for (int64_t n = 0; n < B * T; ++n)
    if (tok[n] < 0 || (vocab_start < 0 && tok[n] >= V))
      fail(
          "embedding: token id {} at position {} (batch {}, t {}) is outside the vocabulary "
          "[0, {})",
          tok[n], n, n / T, n % T, V);
  const int32_t* pos = wpe.defined() && positions.defined() ? positions.data<int32_t>() : nullptr;
  for (int64_t n = 0; pos && n < B * T; ++n)
    if (pos[n] < 0 || pos[n] >= wpe.dim(0))
      fail(
          "nf4_embedding_forward: position id {} at (batch {}, t {}) is outside [0, "
          "max_seq_len = {})",
          pos[n], n / T, n % T, wpe.dim(0));
  if (out.dtype() == DType::F32)
    embedding_fwd(out.data<float>(), tok, wte, wpe.defined() ? wpe.data<float>() : nullptr, pos,
                  B * T, T, std::max<int64_t>(vocab_start, 0));
  else
    embedding_fwd(out.data<bf16>(), tok, wte, wpe.defined() ? wpe.data<bf16>() : nullptr, pos,
                  B * T, T, std::max<int64_t>(vocab_start, 0));
}

}  // namespace nk::ops::NK_CPU_NS
