// Quantised weights on the CPU, part 2: quant_linear_forward. Few rows of x
// (decode) take the direct kernel of quant_dot.cc, which reads W's blocks;
// more rows (batched decode, prefill) take the integer tiles of
// quant_gemm.cc where the build has AVX-512 VNNI (every row count for a
// weight packed by quant_pack), and otherwise (or for
// W8A16 and F16) dequantise a panel of W's rows at a time (~kPanelBytes of
// f32) into a scratch buffer and run oneDNN's f32 product on it, as the NF4
// products do. No path holds a dense copy of W; the scratch buffers
// grow to the largest size seen and are never shrunk.
#include <algorithm>

#include "core/parallel.h"
#include "ops/cpu/dnnl_matmul.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"
#include "ops/cpu/quant_blocks.h"

namespace nk::ops::NK_CPU_NS {
namespace {

// Rows of x up to which the direct kernel is faster than dequantising W and
// running the dense product: each x row adds 0.5 to 0.9 of its one-row cost
// (compute, the weights being in L1 by then), while the panel path's cost is
// mostly the dequantisation and oneDNN's f32 product. bench_quant --sweep
// ([2048 x 2048], 1 and 2 threads of a 2-core AVX2 machine): the direct
// kernels were faster up to N = 16..24 for the types that quantise x and up
// to 12..14 for W8A16 (f32 FMAs). F16, 4 x rows a pass, on a 2-core AVX-512
// machine: faster to N = 32 (1.61 against 1.80 ms there, 0.81 against 1.17
// at 16). Where the VNNI tiles exist they take over from N = 2 instead.
int64_t direct_rows_max(QuantType t) {
  if (t == QuantType::F16 || t == QuantType::BF16) return 32;
  return t == QuantType::W8A16 ? 12 : 16;
}

// Rows of x from which the VNNI tiles (where the build has them) take over
// from the direct kernel: unpacking a group costs about one direct row, and
// each further row a third to a half of a direct one. bench_quant --sweep,
// [2048 x 2048], 2 threads of a 2-core AVX-512 machine (ms, direct / tiles):
// at N = 2 q8_0 0.127 / 0.109, q4_0 0.104 / 0.099, q4_k 0.093 / 0.089, q6_k
// about even (0.097 / 0.113 and 0.126 / 0.112 in two runs), w8a8 0.075 /
// 0.093 (it catches up at N = 3: 0.108 / 0.098). Above it the tiles beat
// the panels at every N measured (to 64: 3.0x for q4_0).
int64_t gemm_rows_min(QuantType t) {
  return t == QuantType::W8A8 ? 3 : 2;
}

// Target f32 size of a dequantised panel: it stays in L2/L3 while oneDNN packs
// it (the NF4 products' choice; not re-tuned here).
constexpr size_t kPanelBytes = size_t(1) << 20;

std::vector<char> g_lin_panel, g_lin_product, g_lin_xf, g_lin_bias;

// Rows [o0, o0 + p) of W in f32 into panel [p, in].
void dequant_panel(const QuantWeight& w, int64_t o0, int64_t p, float* panel) {
  const int64_t in = w.cols();
  const float* scale = w.scale.defined() ? w.scale.data<float>() : nullptr;
  parallel_for(p, std::max<int64_t>(1, 8192 / in), [&](int64_t r0, int64_t r1) {
    thread_local std::vector<uint8_t> buf;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t o = o0 + r;
      quant_dequant_row(w.type, quant_row(w, o, buf), scale ? scale[o] : 0.f, in, panel + r * in);
    }
  });
}

// y[:, o0 : o0 + p] = prod [n, p] in T.
template <typename T>
void store_columns(T* y, int64_t ld, int64_t o0, const float* prod, int64_t n, int64_t p) {
  parallel_for(n, std::max<int64_t>(1, 16384 / p), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < p; ++j) y[r * ld + o0 + j] = store<T>(prod[r * p + j]);
  });
}

// The prefill path: the product in f32 (bf16 x widened first, the weight's
// values used in f32), bias added inside oneDNN's product, y rounded once.
template <typename T>
void by_panels(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b) {
  const int64_t n = rows_of(x), in = w.cols(), out = w.rows();
  const float* xf = rows_as_f32(x, g_lin_xf);
  const float* bias = b.defined() ? rows_as_f32(b, g_lin_bias) : nullptr;
  const int64_t rows =
      std::min<int64_t>(out, std::max<int64_t>(16, int64_t(kPanelBytes) / (4 * in)));
  float* panel = scratch<float>(g_lin_panel, size_t(rows * in));
  const bool direct_out = std::is_same_v<T, float> && rows == out;
  float* prod = direct_out ? y.data<float>() : scratch<float>(g_lin_product, size_t(n * rows));
  for (int64_t o0 = 0; o0 < out; o0 += rows) {
    const int64_t p = std::min(rows, out - o0);
    dequant_panel(w, o0, p, panel);
    MatmulSpec s{.m = n, .n = p, .k = in};
    s.trans_b = true;  // the panel [p, in] read as [in, p]
    s.has_bias = bias != nullptr;
    dnnl_matmul(s, xf, panel, prod, bias ? bias + o0 : nullptr);
    if (!direct_out) store_columns(y.data<T>(), out, o0, prod, n, p);
  }
}

}  // namespace

const float* rows_as_f32(const Tensor& t, std::vector<char>& buf) {
  if (t.dtype() == DType::F32) return t.data<float>();
  const int64_t n = t.numel();
  float* out = scratch<float>(buf, size_t(n));
  const bf16* src = t.data<bf16>();
  parallel_for(n, 1 << 14, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = load(src[i]);
  });
  return out;
}

void quant_linear_panels(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b) {
  if (x.dtype() == DType::F32)
    by_panels<float>(y, x, w, b);
  else
    by_panels<bf16>(y, x, w, b);
}

QuantPath quant_linear_path(QuantType t, int64_t in, int64_t n, QuantLayout layout) {
  if (layout == QuantLayout::Packed16) return QuantPath::Gemm;
  if (quant_gemm_available(t, in))
    return n < gemm_rows_min(t) ? QuantPath::Direct : QuantPath::Gemm;
  return n <= direct_rows_max(t) ? QuantPath::Direct : QuantPath::Panels;
}

void quant_linear_forward(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b) {
  switch (quant_linear_path(w.type, w.cols(), rows_of(x), w.layout)) {
    case QuantPath::Direct:
      return quant_linear_direct(y, x, w, b);
    case QuantPath::Gemm:
      return quant_linear_gemm(y, x, w, b);
    case QuantPath::Panels:
      return quant_linear_panels(y, x, w, b);
  }
}

}  // namespace nk::ops::NK_CPU_NS
