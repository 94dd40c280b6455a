// Quantised products (ops::quant_linear_forward and its three CPU paths,
// ops/cpu/quant_blocks.h): against references with the activation's
// quantisation replayed in double and against the dense op, on every row
// count, thread count and dtype, and with non-finite x. CPU only.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "ops/cpu/quant_blocks.h"
#include "ops/cpu_quant_paths.h"
#include "ops/op_harness.h"
#include "ops/ops.h"
#include "ops/quant.h"
#include "quant_test_util.h"
#include "test_util.h"

namespace nk {
namespace {

using namespace test;        // make, randn, values
using namespace quant_test;  // kAllTypes, quantized, dequantized, ...

// The types whose products take x as it is (no 8-bit rounding of x).
bool plain_x(QuantType t) {
  return t == QuantType::W8A16 || t == QuantType::F16 || t == QuantType::BF16;
}

// The kernel's quantisation of one block of x: d = max|x| / 127 in f32,
// q = nearest-even rounding of x / d in f32.
void quantize_x_block(const double* x, int64_t n, double& d, std::vector<double>& q) {
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(float(x[i])));
  const float df = amax / 127.f;
  d = df;
  q.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) q[size_t(i)] = df == 0.f ? 0.0 : std::nearbyint(float(x[i]) / df);
}

// Values per x scale on a path: blocks of 32 for Q8_0 and Q4_0; for the K
// types 256 on the direct kernel (llama.cpp's Q8_K) and 32 on the VNNI tiles
// (which apply x's scale per sub-block anyway); W8A8 a scale per row; W8A16
// and F16 do not quantise x.
int64_t x_block(QuantType t, int64_t in, ops::QuantPath path) {
  switch (t) {
    case QuantType::Q8_0:
    case QuantType::Q4_0:
      return 32;
    case QuantType::Q4_K:
    case QuantType::Q6_K:
      return path == ops::QuantPath::Gemm ? 32 : 256;
    default:
      return in;
  }
}

// y[n, o] in double from the dequantised weight wd [out, in] and x [N, in]:
// `exact` the dense product, `replayed` with x quantised as the kernel does,
// `bound` |W| . (x's rounding error) <= sum_i |w_i| d_b(i) / 2, the most the
// two can differ by.
struct Refs {
  std::vector<double> exact, replayed, bound;
};
Refs references(QuantType t, const std::vector<double>& wd, const std::vector<double>& x,
                const std::vector<double>& bias, int64_t N, int64_t in, int64_t out,
                std::optional<ops::QuantPath> path = {}) {  // default: the path N rows take
  Refs r;
  const int64_t blk =
      x_block(t, in, path.value_or(ops::cpu_quant_paths().path(t, in, N, ops::QuantLayout::Rows)));
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> xq(static_cast<size_t>(in)), xd(static_cast<size_t>(in));
    for (int64_t b0 = 0; b0 < in; b0 += blk) {
      double d;
      std::vector<double> q;
      quantize_x_block(&x[size_t(n * in + b0)], blk, d, q);
      for (int64_t i = 0; i < blk; ++i) {
        xq[size_t(b0 + i)] = plain_x(t) ? x[size_t(n * in + b0 + i)] : d * q[size_t(i)];
        xd[size_t(b0 + i)] = plain_x(t) ? 0.0 : d;
      }
    }
    for (int64_t o = 0; o < out; ++o) {
      double e = bias.empty() ? 0 : bias[size_t(o)], p = e, bnd = 0;
      for (int64_t i = 0; i < in; ++i) {
        const double w = wd[size_t(o * in + i)];
        e += w * x[size_t(n * in + i)];
        p += w * xq[size_t(i)];
        bnd += std::fabs(w) * xd[size_t(i)] / 2;
      }
      r.exact.push_back(e);
      r.replayed.push_back(p);
      r.bound.push_back(bnd);
    }
  }
  return r;
}

// A width per type off every internal tiling: not a multiple of 64 values
// (Q8_0/Q4_0: 37 blocks), of 512 (K types: 5 super-blocks), or of 32 (W8).
int64_t odd_in(QuantType t) {
  switch (t) {
    case QuantType::Q8_0:
    case QuantType::Q4_0:
      return 32 * 37;
    case QuantType::Q4_K:
    case QuantType::Q6_K:
      return 256 * 5;
    default:
      return 1001;
  }
}

// quant_linear_forward against (1) the dense op, linear_forward, on the
// dequantised weight (f32; for bf16 x, x widened to f32 and y rounded, since
// the kernel uses the weight's values in f32) within the x-rounding bound
// plus f32 slack, and (2) tighter: the direct kernel and the VNNI tiles
// against the product with x quantised as they do, the panel path against
// the dense product, to 1e-5 of the output's scale (f32 sums of ~in/32 block
// products reordered) + 1 bf16 ulp for bf16. W8A16 quantises nothing: always
// to the dense product. Which path N takes depends on the build (the tiles
// need AVX-512 VNNI); N = 1, 3, 17, 64 cover each path of either build.
void check_linear(QuantType t, int64_t N, DType dt, bool bias, uint64_t seed, int64_t in = 0) {
  if (in == 0) in = odd_in(t);
  const int64_t out = 203;
  SCOPED_TRACE(::testing::Message() << ops::quant_type_name(t) << " N=" << N << " "
                                    << dtype_name(dt) << " bias=" << bias << " in=" << in);
  const ops::QuantWeight q = quantized(
      t, f32_tensor({out, in}, gaussian(size_t(out * in), seed, 1 / std::sqrt(double(in)))));
  const Tensor wd = dequantized(q);
  const Tensor x = make({N, in}, dt, randn(size_t(N * in), seed + 1));
  const Tensor b = bias ? make({out}, dt, randn(size_t(out), seed + 2)) : Tensor();
  Tensor y = Tensor::empty({N, out}, dt);
  ops::quant_linear_forward(y, x, q, b);
  const std::vector<double> got = values(y);
  const Refs r =
      references(t, values(wd), values(x), bias ? values(b) : std::vector<double>{}, N, in, out);
  const bool b16 = dt == DType::BF16;

  // (1) linear_forward on the dequantised weight in f32.
  Tensor x32 = Tensor::empty({N, in}, DType::F32), y32 = Tensor::empty({N, out}, DType::F32);
  ops::convert(x32, x);
  Tensor b32 = bias ? Tensor::empty({out}, DType::F32) : Tensor();
  if (bias) ops::convert(b32, b);
  ops::linear_forward(y32, x32, wd, b32);
  const bool panels =
      ops::cpu_quant_paths().path(t, in, N, ops::QuantLayout::Rows) == ops::QuantPath::Panels;
  std::vector<double> slack = r.bound;
  if (plain_x(t) || panels) slack.clear();
  expect_close(got, values(y32), {2e-5, 0}, "y vs linear_forward", slack, b16);

  // (2) the tight references.
  if (plain_x(t) || panels)
    expect_close(got, r.exact, {1e-5, 0}, "y vs dense product", {}, b16);
  else
    expect_close(got, r.replayed, {1e-5, 0}, "y vs product with x quantised", {}, b16);
}

NK_COVERS(QuantLinear, MatchesReferencesF32, quant_linear_forward);
TEST(QuantLinear, MatchesReferencesF32) {
  uint64_t seed = 100;
  for (QuantType t : kAllTypes)
    for (int64_t N : {1, 3, 17, 64}) check_linear(t, N, DType::F32, N != 3, seed += 10);
}

TEST(QuantLinear, MatchesReferencesBF16) {
  uint64_t seed = 500;
  for (QuantType t : kAllTypes)
    for (int64_t N : {1, 3, 17, 64}) check_linear(t, N, DType::BF16, N != 17, seed += 10);
}

// The f16 and bf16 kernels read one x row's weights row by row up to 4096
// values a row, R rows at once beyond (ops/cpu/quant_dot_avx2.h): rows past
// 4096, with a tail of 9 values, take the other loop.
TEST(QuantLinear, LongF16RowsMatchTheReferences) {
  uint64_t seed = 900;
  for (QuantType t : {QuantType::F16, QuantType::BF16}) {
    for (int64_t N : {1, 2}) check_linear(t, N, DType::F32, true, seed += 10, 4105);
    check_linear(t, 1, DType::BF16, false, seed += 10, 4105);
  }
}

// Every N from 1 to 20 against the dense product within the x-rounding
// bound: whatever the threshold between the paths, both agree with it.
TEST(QuantLinear, EveryRowCountAgreesWithTheDenseProduct) {
  const int64_t in = 512, out = 37;
  for (QuantType t : kAllTypes) {
    const ops::QuantWeight q =
        quantized(t, f32_tensor({out, in}, gaussian(size_t(out * in), 7, 0.05)));
    const std::vector<double> wd = values(dequantized(q));
    for (int64_t N = 1; N <= 20; ++N) {
      SCOPED_TRACE(::testing::Message() << ops::quant_type_name(t) << " N=" << N);
      const Tensor x = make({N, in}, DType::F32, randn(size_t(N * in), uint64_t(N)));
      Tensor y = Tensor::empty({N, out}, DType::F32);
      ops::quant_linear_forward(y, x, q, Tensor());
      const Refs r = references(t, wd, values(x), {}, N, in, out);
      expect_close(values(y), r.exact, {2e-5, 0}, "y", r.bound, false);
    }
  }
}

// Past a few hundred rows the panel path takes x in several passes
// (kBlockPassRows, 384): 401 rows of a [1, 401, in] x, each checked (a last
// tile of 5 rows of x, a last block of 5 of W's rows at AVX2, 5 at AVX-512).
TEST(QuantLinear, ManyRowsAgreeWithTheDenseProduct) {
  const int64_t N = 401, in = 256, out = 37;
  for (QuantType t : {QuantType::F16, QuantType::Q4_K, QuantType::W8A16}) {
    SCOPED_TRACE(ops::quant_type_name(t));
    const ops::QuantWeight q =
        quantized(t, f32_tensor({out, in}, gaussian(size_t(out * in), 12, 0.05)));
    const Tensor x = make({1, N, in}, DType::F32, randn(size_t(N * in), 13));
    const Tensor b = make({out}, DType::F32, randn(size_t(out), 14));
    Tensor y = Tensor::empty({1, N, out}, DType::F32);
    ops::quant_linear_forward(y, x, q, b);
    const Refs r = references(t, values(dequantized(q)), values(x), values(b), N, in, out);
    if (plain_x(t) ||
        ops::cpu_quant_paths().path(t, in, N, ops::QuantLayout::Rows) == ops::QuantPath::Panels)
      expect_close(values(y), r.exact, {2e-5, 0}, "y", {}, false);
    else
      expect_close(values(y), r.replayed, {2e-5, 0}, "y", {}, false);
  }
}

// A bf16 layer with an f32 bias, as linear_forward allows.
TEST(QuantLinear, Bf16WithF32Bias) {
  for (int64_t N : {2, 40}) {
    const ops::QuantWeight q =
        quantized(QuantType::Q4_K, f32_tensor({64, 512}, gaussian(64 * 512, 9, 0.04)));
    const Tensor x = make({N, 512}, DType::BF16, randn(size_t(N * 512), 10));
    const Tensor b = make({64}, DType::F32, randn(64, 11));
    Tensor y = Tensor::empty({N, 64}, DType::BF16);
    ops::quant_linear_forward(y, x, q, b);
    const Refs r =
        references(QuantType::Q4_K, values(dequantized(q)), values(x), values(b), N, 512, 64);
    expect_close(values(y), r.exact, {2e-5, 0}, "y", r.bound, true);
  }
}

// Every path (the direct kernel, the VNNI tiles, the panel path's register
// tiles) gives the same y, bit for bit, with 1 and 2 threads: each output is
// summed by one thread in a fixed order.
TEST(QuantLinear, SameResultOnAnyThreadCount) {
  const int saved = num_threads();
  for (QuantType t : kAllTypes) {
    const ops::QuantWeight q =
        quantized(t, f32_tensor({301, 1024}, gaussian(301 * 1024, 12, 0.03)));
    for (int64_t N : {1, 3, 33}) {
      SCOPED_TRACE(::testing::Message() << ops::quant_type_name(t) << " N=" << N);
      const Tensor x = make({N, 1024}, DType::F32, randn(size_t(N * 1024), 13));
      std::vector<Tensor> ys;
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        ys.push_back(Tensor::empty({N, 301}, DType::F32));
        ops::quant_linear_forward(ys.back(), x, q, Tensor());
      }
      EXPECT_TRUE(bytes_of(ys[0]) == bytes_of(ys[1]));
    }
  }
  set_num_threads(saved);
}

// The VNNI tiles called directly at every row count (1 included, which
// quant_linear_forward leaves to the direct kernel), against the product with
// x quantised as they do, to f32 reordering (1e-5 of y's scale, 1 bf16 ulp
// for bf16): passes of 1..8 rows, 203 outputs (a last group of 11 of 16
// rows), widths off the 512-value tiles. For Q8_0, Q4_0 and W8A8 they sum
// the very integers of the direct kernel, so the two agree to the same
// tolerance.
TEST(QuantLinear, VnniTilesMatchTheirReferenceAndTheDirectKernel) {
  uint64_t seed = 900;
  int checked = 0;
  for (QuantType t : kAllTypes) {
    const int64_t in = odd_in(t) / 32 * 32, out = 203;
    if (!ops::cpu_quant_paths().gemm_available(t, in)) continue;
    const ops::QuantWeight q =
        quantized(t, f32_tensor({out, in}, gaussian(size_t(out * in), seed += 10, 0.04)));
    for (DType dt : {DType::F32, DType::BF16})
      for (int64_t N : {1, 2, 7, 8, 9, 16, 33}) {
        SCOPED_TRACE(::testing::Message()
                     << ops::quant_type_name(t) << " N=" << N << " " << dtype_name(dt));
        const Tensor x = make({N, in}, dt, randn(size_t(N * in), seed + uint64_t(N)));
        const Tensor b = make({out}, dt, randn(size_t(out), seed + 1));
        Tensor tiles = Tensor::empty({N, out}, dt), direct = Tensor::empty({N, out}, dt);
        ops::cpu_quant_paths().gemm(tiles, x, q, b);
        const bool b16 = dt == DType::BF16;
        const Refs r = references(t, values(dequantized(q)), values(x), values(b), N, in, out,
                                  ops::QuantPath::Gemm);
        expect_close(values(tiles), r.replayed, {1e-5, 0}, "tiles vs product with x quantised", {},
                     b16);
        if (t != QuantType::Q4_K && t != QuantType::Q6_K) {
          ops::cpu_quant_paths().direct(direct, x, q, b);
          expect_close(values(tiles), values(direct), {1e-5, 0}, "tiles vs direct kernel", {}, b16);
        }
        ++checked;
      }
  }
  if (checked == 0) GTEST_SKIP() << "this build does not target AVX-512 VNNI";
}

// A packed weight (ops::quant_pack) takes the tiles for every row count, its
// tiles made where they lie (or unpacked once, Q6_K above 8 rows): y is the
// row layout's tiles' y bit for bit (the same integer sums and f32 steps),
// for passes of 1..8 rows, two whole passes and more, both dtypes and 1 or 2
// threads, so it meets their reference (VnniTilesMatch... above) as well.
TEST(QuantLinear, PackedWeightsGiveTheTilesYBitForBit) {
  uint64_t seed = 950;
  int checked = 0;
  for (QuantType t : kAllTypes) {
    const int64_t in = odd_in(t) / 32 * 32, out = 208;
    const ops::QuantWeight rows =
        quantized(t, f32_tensor({out, in}, gaussian(size_t(out * in), seed += 10, 0.04)));
    ops::QuantWeight packed = copy_of(rows);
    if (!ops::quant_pack(packed)) continue;
    const int saved = num_threads();
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      for (DType dt : {DType::F32, DType::BF16})
        for (int64_t N : {1, 2, 5, 8, 9, 16, 17, 33}) {
          SCOPED_TRACE(::testing::Message() << ops::quant_type_name(t) << " N=" << N << " "
                                            << dtype_name(dt) << " threads=" << threads);
          const Tensor x = make({N, in}, dt, randn(size_t(N * in), seed + uint64_t(N)));
          const Tensor b = make({out}, dt, randn(size_t(out), seed + 1));
          Tensor want = Tensor::empty({N, out}, dt), got = Tensor::empty({N, out}, dt);
          ops::cpu_quant_paths().gemm(want, x, rows, b);
          ops::quant_linear_forward(got, x, packed, b);
          EXPECT_EQ(bytes_of(got), bytes_of(want));
          ++checked;
        }
    }
    set_num_threads(saved);
  }
  if (checked == 0) GTEST_SKIP() << "this build does not target AVX-512 VNNI";
}

// A row-parallel layer split over two tensor-parallel ranks: each rank's
// product over its half of the columns (W's blocks cut at a block boundary:
// the same blocks, quantised on their own), summed, equals the whole
// product up to the order of the f32 sums, packed or not, at every row
// count (so a split model decodes as one process does).
TEST(QuantLinear, ColumnSharesSumToTheWholeProduct) {
  uint64_t seed = 990;
  for (QuantType t : kAllTypes) {
    if (plain_x(t) || t == QuantType::W8A8) continue;  // (W8A8: a scale per x row)
    const int64_t in = 1024, half = in / 2, out = 64;
    const Tensor w = f32_tensor({out, in}, gaussian(size_t(out * in), seed += 10, 0.04));
    Tensor w0 = Tensor::empty({out, half}, DType::F32), w1 = Tensor::empty({out, half}, DType::F32);
    ops::copy_columns(w0, w, 0, 1.f);
    ops::copy_columns(w1, w, half, 1.f);
    for (bool pack : {false, true}) {
      ops::QuantWeight q = quantized(t, w), q0 = quantized(t, w0), q1 = quantized(t, w1);
      if (pack && !(ops::quant_pack(q) && ops::quant_pack(q0) && ops::quant_pack(q1))) continue;
      for (int64_t N : {1, 2, 6, 17}) {
        SCOPED_TRACE(::testing::Message()
                     << ops::quant_type_name(t) << " N=" << N << (pack ? " packed" : ""));
        const Tensor x = make({N, in}, DType::F32, randn(size_t(N * in), seed + uint64_t(N)));
        Tensor x0 = Tensor::empty({N, half}, DType::F32), x1 = Tensor::empty({N, half}, DType::F32);
        ops::copy_columns(x0, x, 0, 1.f);
        ops::copy_columns(x1, x, half, 1.f);
        Tensor y = Tensor::empty({N, out}, DType::F32), y0 = Tensor::empty({N, out}, DType::F32),
               y1 = Tensor::empty({N, out}, DType::F32);
        ops::quant_linear_forward(y, x, q, Tensor());
        ops::quant_linear_forward(y0, x0, q0, Tensor());
        ops::quant_linear_forward(y1, x1, q1, Tensor());
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < N * out; ++i) {
          const double a = y.data<float>()[i],
                       b = double(y0.data<float>()[i]) + y1.data<float>()[i];
          worst = std::max(worst, std::fabs(a - b));
          scale = std::max(scale, std::fabs(a));
        }
        EXPECT_LE(worst, 1e-5 * scale);
      }
    }
  }
}

// A NaN or infinity in x makes y non-finite, as in the dense product, on
// both paths (the 8-bit quantisation of x must not hide it).
TEST(QuantLinear, NonFiniteXGivesNonFiniteY) {
  for (QuantType t : kAllTypes) {
    const ops::QuantWeight q = quantized(t, f32_tensor({8, 512}, gaussian(8 * 512, 16, 0.05)));
    for (int64_t N : {1, 20})
      for (float bad : {NAN, INFINITY}) {
        std::vector<double> xv = randn(size_t(N * 512), 17);
        xv[size_t((N - 1) * 512 + 300)] = bad;
        Tensor y = Tensor::empty({N, 8}, DType::F32);
        ops::quant_linear_forward(y, make({N, 512}, DType::F32, xv), q, Tensor());
        const std::vector<double> got = values(y);
        for (int64_t o = 0; o < 8; ++o)
          EXPECT_FALSE(std::isfinite(got[size_t((N - 1) * 8 + o)]))
              << ops::quant_type_name(t) << " N=" << N << " x " << bad << " y[" << o << "]";
      }
  }
}

}  // namespace
}  // namespace nk
