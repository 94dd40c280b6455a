// NF4 weights (QLoRA): quantisation value for value against an independent
// numpy quantiser (tests/ops/nf4_reference.py), reading back any range, the
// fused products and the embedding against the dense ops on the dequantised
// weight, the storage size, the quantisation error on normal data, and bad
// input. The NF4 ops have a CPU kernel only, so these are plain CPU tests
// rather than tests over every backend.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "ops/cpu/dnnl_matmul.h"
#include "ops/op_harness.h"
#include "ops/ops.h"
#include "test_paths.h"
#include "test_util.h"

namespace nk {
namespace {

using namespace test;  // make, randn, values, TempDir, run_command, ...

Tensor f32_tensor(const std::vector<float>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::F32);
  std::memcpy(t.raw(), v.data(), v.size() * sizeof(float));
  return t;
}

ops::Nf4Weight quantized(const Tensor& w) {
  ops::Nf4Weight q = ops::Nf4Weight::empty(w.shape());
  ops::nf4_quantize(q, w);
  return q;
}

Tensor dequantized(const ops::Nf4Weight& q, DType dtype) {
  Tensor out = Tensor::empty(q.shape, dtype);
  ops::nf4_dequantize(out, q);
  return out;
}

std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw()), t.nbytes());
}

// All four tensors of q, byte for byte.
std::string storage_bytes(const ops::Nf4Weight& q) {
  return bytes_of(q.codes) + bytes_of(q.absmax_codes) + bytes_of(q.absmax_scale) +
         bytes_of(q.absmax_offset);
}

// ---- value for value against the independent quantiser ----

// Normal weights at a layer's scale with outliers, one all-zero block and one
// of negative zeros; 529 blocks (3 scale blocks, the last short), the last
// block short.
std::vector<float> normal_case() {
  std::vector<float> w(2 * 64 * 256 + 1000 + 37);
  Rng r(1);
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(r.normal() * 0.02 * (i % 997 ? 1 : 25));
  std::fill(w.begin() + 5 * 64, w.begin() + 6 * 64, 0.f);
  std::fill(w.begin() + 6 * 64, w.begin() + 7 * 64, -0.f);
  return w;
}

// The levels i whose midpoint with level i + 1 f32 holds exactly.
std::vector<int> exact_midpoints() {
  std::vector<int> out;
  for (int i = 0; i + 1 < 16; ++i) {
    const double m = (double(ops::kNf4Levels[i]) + double(ops::kNf4Levels[i + 1])) / 2;
    if (double(float(m)) == m) out.push_back(i);
  }
  return out;
}

// Exact ties: blocks with absmax 1 (scaled by powers of two, 2^-100 ~ 1e-30
// among them) holding those midpoints and their negations; a subnormal
// block; a zero block.
std::vector<float> ties_case() {
  std::vector<float> mids;
  for (int i : exact_midpoints())
    mids.push_back(float((double(ops::kNf4Levels[i]) + double(ops::kNf4Levels[i + 1])) / 2));
  std::vector<float> w;
  for (int e : {0, -100, 20, -3}) {
    std::vector<float> block(64, 0.f);
    block[0] = std::ldexp(1.f, e);
    for (size_t j = 0; j < mids.size(); ++j) {
      block[1 + 2 * j] = std::ldexp(mids[j], e);
      block[2 + 2 * j] = -std::ldexp(mids[j], e);
    }
    w.insert(w.end(), block.begin(), block.end());
  }
  Rng r(2);
  for (int i = 0; i < 64; ++i) w.push_back(float(r.normal() * 1e-40));  // subnormal
  w.insert(w.end(), 64, 0.f);
  for (int i = 0; i < 100; ++i) w.push_back(float(r.normal()));
  return w;
}

// Every block's absmax equal: the centred absmaxes are all 0 (scale 0).
std::vector<float> constant_case() {
  std::vector<float> w(64 * 300);
  for (size_t i = 0; i < w.size(); ++i) w[i] = i % 2 ? 1.f : -1.f;
  return w;
}

// Blocks whose scales span 1e-6 .. 1e3, so the absmax codes use much of the
// dynamic map.
std::vector<float> wide_case() {
  std::vector<float> w(64 * (3 * 256 + 5));
  Rng r(3);
  for (size_t b = 0; b < w.size() / 64; ++b) {
    const double s = std::pow(10.0, -6 + 9 * r.uniform());
    for (size_t i = 0; i < 64; ++i) w[b * 64 + i] = float(r.normal() * s);
  }
  return w;
}

TEST(Nf4Reference, MatchesIndependentQuantiserValueForValue) {
  const std::vector<std::pair<std::string, std::vector<float>>> cases = {
      {"normal", normal_case()},
      {"ties", ties_case()},
      {"constant", constant_case()},
      {"wide", wide_case()},
      {"odd", {0.5f, -1.5f, 0.25f, 3.f, -0.f}}};
  TempDir dir("nf4_ref");
  for (const auto& [name, w] : cases)
    write_file(dir / (name + ".f32"),
               std::string(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float)));
  const RunResult py = run_command(std::string("/usr/bin/python3 ") + NK_SOURCE_DIR +
                                   "/tests/ops/nf4_reference.py " + dir.path().string());
  ASSERT_EQ(py.code, 0) << py.out;

  // The dynamic map, bit for bit.
  const std::string dyn = read_file(dir / "dynamic.f32");
  ASSERT_EQ(dyn.size(), 256 * sizeof(float));
  EXPECT_EQ(std::memcmp(dyn.data(), ops::nf4_dynamic_levels(), dyn.size()), 0);
  EXPECT_EQ(ops::nf4_dynamic_levels()[127], 0.f);
  EXPECT_EQ(ops::nf4_dynamic_levels()[255], 1.f);

  for (const auto& one : cases) {
    const std::string& name = one.first;  // a plain name: clang 14 lambdas cannot capture bindings
    SCOPED_TRACE(name);
    const ops::Nf4Weight q = quantized(f32_tensor(one.second));
    auto expect_bytes = [&](const Tensor& t, const char* ext) {
      const std::string want = read_file(dir / (name + ext)), got = bytes_of(t);
      ASSERT_EQ(got.size(), want.size()) << ext;
      size_t bad = 0, first = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != want[i] && bad++ == 0) first = i;
      EXPECT_EQ(bad, 0u) << ext << ": " << bad << " bytes differ, the first at byte " << first;
    };
    expect_bytes(q.codes, ".codes");  // every nibble, the pad nibble too
    expect_bytes(q.absmax_codes, ".acodes");
    expect_bytes(q.absmax_scale, ".scale");
    expect_bytes(q.absmax_offset, ".offset");
    expect_bytes(dequantized(q, DType::F32), ".deq");
  }
  // Equal absmaxes: scale 0, absmax code of level 0.0, values read back exactly.
  const ops::Nf4Weight flat = quantized(f32_tensor(constant_case()));
  EXPECT_EQ(values(flat.absmax_scale), std::vector<double>(2, 0.0));
  EXPECT_EQ(flat.absmax_codes.data<uint8_t>()[0], 127);
  const std::vector<float> w_flat = constant_case();
  EXPECT_EQ(values(dequantized(flat, DType::F32)),
            std::vector<double>(w_flat.begin(), w_flat.end()));
  // The ties went to the lower level, at every scale: in each tie block,
  // value 0 is the absmax (level 15) and value 1 + 2j the midpoint above
  // level exact_midpoints()[j].
  const std::vector<int> tied = exact_midpoints();
  ASSERT_GE(tied.size(), 2u);  // 6 (level 6 / 0) and 7 (0 / level 8) at least
  const ops::Nf4Weight q = quantized(f32_tensor(ties_case()));
  const uint8_t* c = q.codes.data<uint8_t>();
  auto code = [&](size_t i) { return i % 2 ? c[i / 2] & 15 : c[i / 2] >> 4; };
  for (size_t block = 0; block < 4; ++block) {
    EXPECT_EQ(code(block * 64), 15);
    for (size_t j = 0; j < tied.size(); ++j)
      EXPECT_EQ(code(block * 64 + 1 + 2 * j), tied[j]) << "block " << block << " tie " << j;
  }
}

// The same weights whatever the thread count.
TEST(Nf4, QuantizeIsTheSameOnAnyThreadCount) {
  const Tensor w = f32_tensor(wide_case());
  const int saved = num_threads();
  std::vector<std::string> runs;
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    runs.push_back(storage_bytes(quantized(w)));
  }
  set_num_threads(saved);
  EXPECT_EQ(runs[0], runs[1]);
}

// ---- reading back ----

NK_COVERS(Nf4, DequantizesAnyRange, nf4_quantize, nf4_dequantize);
TEST(Nf4, DequantizesAnyRange) {
  const int64_t n = 64 * 300 + 13;
  std::vector<float> w(static_cast<size_t>(n));
  Rng r(4);
  for (auto& v : w) v = float(r.normal());
  const ops::Nf4Weight q = quantized(f32_tensor(w));
  const std::vector<double> all = values(dequantized(q, DType::F32));
  for (auto [start, count] : std::vector<std::pair<int64_t, int64_t>>{{0, n},
                                                                      {1, 1},
                                                                      {1, 2},
                                                                      {63, 2},
                                                                      {65, 64 * 20 + 1},
                                                                      {n - 1, 1},
                                                                      {n - 13, 13},
                                                                      {777, 5000},
                                                                      {64 * 256 - 3, 70}}) {
    SCOPED_TRACE(::testing::Message() << "start " << start << " count " << count);
    for (DType t : {DType::F32, DType::BF16}) {
      Tensor out = Tensor::empty({count}, t);
      ops::nf4_dequantize(out, q, start);
      const std::vector<double> got = values(out);
      size_t bad = 0;
      for (int64_t i = 0; i < count; ++i) {
        const float want = float(all[size_t(start + i)]);
        const double w_t = t == DType::F32 ? double(want) : double(bf16_to_f32(f32_to_bf16(want)));
        bad += got[size_t(i)] != w_t;
      }
      EXPECT_EQ(bad, 0u) << dtype_name(t);
    }
  }
  // Any shape of out: a [3, 5] read from value 10.
  Tensor out = Tensor::empty({3, 5}, DType::F32);
  ops::nf4_dequantize(out, q, 10);
  EXPECT_EQ(values(out), std::vector<double>(all.begin() + 10, all.begin() + 25));
}

// ---- the fused products against the dense ops ----

struct Dims {
  int64_t n, in, out;
};

// y and dx of the NF4 ops against linear_forward / linear_backward on the
// weight dequantised to the compute dtype. The two differ only in the order
// of the f32 sums (the panels' products may block K differently):
//  - f32: within 1e-5 of the output's scale (a sum of K <= 2048 products
//    reordered moves it by ~sqrt(K) f32 ulps of its terms, ~1e-6 of scale);
//  - bf16: each output is one rounding of an f32 sum, so a reordered sum can
//    round to the neighbouring bf16 value: one bf16 ulp plus the f32 slack.
void check_products(Dims d, DType t, bool bias, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << dtype_name(t) << " N=" << d.n << " in=" << d.in
                                    << " out=" << d.out << " bias=" << bias);
  const ops::Nf4Weight q = quantized(make(
      {d.out, d.in}, DType::F32, randn(size_t(d.out * d.in), seed, 1 / std::sqrt(double(d.in)))));
  const Tensor w = dequantized(q, t);
  const Tensor x = make({d.n, d.in}, t, randn(size_t(d.n * d.in), seed + 1));
  const Tensor b = bias ? make({d.out}, t, randn(size_t(d.out), seed + 2)) : Tensor();
  Tensor y = Tensor::empty({d.n, d.out}, t), y_ref = Tensor::empty({d.n, d.out}, t);
  ops::nf4_linear_forward(y, x, q, b);
  ops::linear_forward(y_ref, x, w, b);
  const bool ulp = t == DType::BF16;
  expect_close(values(y), values(y_ref), {1e-5, 0}, "y", {}, ulp);

  const Tensor dy = make({d.n, d.out}, t, randn(size_t(d.n * d.out), seed + 3));
  Tensor dx = Tensor::empty({d.n, d.in}, t), dx_ref = Tensor::empty({d.n, d.in}, t);
  ops::nf4_linear_backward_input(dx, dy, q);
  ops::linear_backward(dx_ref, Tensor(), Tensor(), dy, x, w);
  expect_close(values(dx), values(dx_ref), {1e-5, 0}, "dx", {}, ulp);
}

// Shapes off the panels' edges (out = 200 and in = 96 fit one panel; 1000 x
// 1100 and 3000 x 2048 take several, the last short), one row and 37 rows.
const Dims kDims[] = {
    {1, 96, 200}, {37, 96, 200}, {37, 1100, 1000}, {1, 2048, 3000}, {37, 2048, 3000}};

NK_COVERS(Nf4, LinearMatchesDenseOnDequantisedWeightF32, nf4_linear_forward,
          nf4_linear_backward_input);
TEST(Nf4, LinearMatchesDenseOnDequantisedWeightF32) {
  uint64_t seed = 10;
  for (Dims d : kDims)
    for (bool bias : {false, true}) check_products(d, DType::F32, bias, seed += 10);
}

TEST(Nf4, LinearMatchesDenseOnDequantisedWeightBF16) {
  uint64_t seed = 200;
  for (Dims d : kDims)
    for (bool bias : {false, true}) check_products(d, DType::BF16, bias, seed += 10);
}

// A bf16 layer with an f32 bias, as linear_forward allows; and a second call
// creates no oneDNN primitive (the step allocates nothing new).
TEST(Nf4, LinearBf16WithF32BiasAndNoNewPrimitives) {
  const Dims d{5, 1100, 1000};
  const ops::Nf4Weight q =
      quantized(make({d.out, d.in}, DType::F32, randn(size_t(d.out * d.in), 7, 0.03)));
  const Tensor x = make({d.n, d.in}, DType::BF16, randn(size_t(d.n * d.in), 8));
  const Tensor b = make({d.out}, DType::F32, randn(size_t(d.out), 9));
  Tensor y = Tensor::empty({d.n, d.out}, DType::BF16),
         y_ref = Tensor::empty({d.n, d.out}, DType::BF16);
  ops::nf4_linear_forward(y, x, q, b);
  ops::linear_forward(y_ref, x, dequantized(q, DType::BF16), b);
  expect_close(values(y), values(y_ref), {1e-5, 0}, "y", {}, true);
  Tensor dx = Tensor::empty({d.n, d.in}, DType::BF16);
  ops::nf4_linear_backward_input(dx, y, q);
  const size_t cached = ops::cpu::dnnl_matmul_cache_size();
  const std::vector<double> first = values(y);
  ops::nf4_linear_forward(y, x, q, b);
  ops::nf4_linear_backward_input(dx, y, q);
  EXPECT_EQ(ops::cpu::dnnl_matmul_cache_size(), cached);
  ops::nf4_linear_forward(y, x, q, b);
  EXPECT_EQ(values(y), first) << "not deterministic";
}

// ---- embedding ----

NK_COVERS(Nf4, EmbeddingEqualsDenseEmbeddingOfDequantisedTable, nf4_embedding_forward);
TEST(Nf4, EmbeddingEqualsDenseEmbeddingOfDequantisedTable) {
  const int64_t B = 2, T = 5, V = 50, maxT = 8;
  std::vector<int32_t> tok(size_t(B * T)), pos(size_t(B * T));
  Rng r(5);
  for (size_t i = 0; i < tok.size(); ++i) {
    tok[i] = int32_t(r.below(V));
    pos[i] = int32_t((i * 3) % maxT);
  }
  const Tensor tokens = make_i32({B, T}, tok), positions = make_i32({B, T}, pos);
  for (int64_t C : {96, 37}) {  // C = 37: rows start mid-byte and mid-block
    const ops::Nf4Weight wte = quantized(make({V, C}, DType::F32, randn(size_t(V * C), 6, 0.5)));
    for (DType t : {DType::F32, DType::BF16}) {
      const Tensor wpe = make({maxT, C}, t, randn(size_t(maxT * C), 7, 0.5));
      const Tensor table = dequantized(wte, t);
      for (int mode = 0; mode < 3; ++mode) {  // no wpe; wpe at n % T; wpe at positions
        SCOPED_TRACE(::testing::Message() << "C=" << C << " " << dtype_name(t) << " mode " << mode);
        const Tensor p = mode == 0 ? Tensor() : wpe, ids = mode == 2 ? positions : Tensor();
        Tensor out = Tensor::empty({B, T, C}, t), out_ref = Tensor::empty({B, T, C}, t);
        ops::nf4_embedding_forward(out, tokens, wte, p, ids);
        ops::embedding_forward(out_ref, tokens, table, p, ids);
        EXPECT_EQ(bytes_of(out), bytes_of(out_ref));
      }
    }
  }
}

TEST(Nf4, EmbeddingBadIdsGiveTheDenseOpsErrors) {
  const int64_t V = 10, C = 4;
  const ops::Nf4Weight wte = quantized(make({V, C}, DType::F32, randn(size_t(V * C), 1)));
  const Tensor table = dequantized(wte, DType::F32);
  Tensor out = Tensor::empty({2, 3, C}, DType::F32);
  for (int32_t bad : {10, -1}) {
    const Tensor tok = make_i32({2, 3}, {1, 2, 3, 4, bad, 5});
    const std::string msg = error_of([&] { ops::nf4_embedding_forward(out, tok, wte, Tensor()); });
    EXPECT_EQ(msg, error_of([&] { ops::embedding_forward(out, tok, table, Tensor()); }));
    EXPECT_TRUE(contains(msg, "token id " + std::to_string(bad) + " at position 4")) << msg;
  }
  const Tensor tok = make_i32({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor wpe = make({4, C}, DType::F32, randn(size_t(4 * C), 2));
  const Tensor pos = make_i32({2, 3}, {0, 1, 2, 0, 4, 1});
  const std::string msg = error_of([&] { ops::nf4_embedding_forward(out, tok, wte, wpe, pos); });
  EXPECT_TRUE(contains(msg, "position id 4 at (batch 1, t 1)")) << msg;
}

// ---- a tensor-parallel rank's shard cut from the whole weight ----

// The shard of `whole` (f32 [R, C]) that `pieces` name, cut from its NF4,
// reads back bit for bit as the whole's dequantised values do (zeros for
// padding), in f32 and bf16; its scale block is `scale_block`.
void check_shard(const Tensor& whole, const std::vector<ops::Nf4Piece>& pieces, int64_t scale_block,
                 const Shape& shard_shape) {
  const ops::Nf4Weight q = quantized(whole);
  const std::vector<double> all = values(dequantized(q, DType::F32));
  ASSERT_EQ(ops::nf4_shard_scale_block(pieces), scale_block);
  ops::Nf4Weight shard = ops::Nf4Weight::empty(shard_shape, kHost, scale_block);
  ops::nf4_take_shard(shard, q, pieces);
  std::vector<double> want;
  for (const ops::Nf4Piece& p : pieces)
    for (int64_t i = 0; i < p.len; ++i)
      want.push_back(p.start < 0 ? 0.0 : all[size_t(p.start + i)]);
  const Tensor got = dequantized(shard, DType::F32);
  EXPECT_EQ(values(got), want);
  size_t negative_zeros = 0;
  for (double v : values(got)) negative_zeros += v == 0 && std::signbit(v);
  size_t whole_negative_zeros = 0;  // (NF4 codes no -0.0: a level 0 times a positive absmax)
  for (double v : all) whole_negative_zeros += v == 0 && std::signbit(v);
  EXPECT_EQ(negative_zeros, 0u);
  EXPECT_EQ(whole_negative_zeros, 0u);
  std::vector<double> want_bf16;
  for (double v : want) want_bf16.push_back(double(bf16_to_f32(f32_to_bf16(float(v)))));
  EXPECT_EQ(values(dequantized(shard, DType::BF16)), want_bf16);
  // Any range of it, as nf4_dequantize reads one.
  Tensor part = Tensor::empty({std::min<int64_t>(100, shard.numel() - 3)}, DType::F32);
  ops::nf4_dequantize(part, shard, 3);
  EXPECT_EQ(values(part), std::vector<double>(want.begin() + 3, want.begin() + 3 + part.numel()));
}

// Row shares (column-parallel), column shares (row-parallel), vocabulary
// padding, and pieces ending in a short block: each scale block of the
// shard draws from one of the whole's, so the whole's scales serve.
TEST(Nf4Shard, CutFromTheWholeReadsItsValuesBitForBit) {
  // [300, 128]: 600 blocks, 3 scale blocks of the whole (the last short).
  const Tensor w = make({300, 128}, DType::F32, randn(300 * 128, 21, 0.02));
  const int64_t C = 128;
  // Rows [0, 150): blocks 0..299, whole scale blocks from the start: 256.
  check_shard(w, {{0, 150 * C}}, 256, {150, C});
  // Rows [150, 300): blocks 300..599, the whole's scale blocks change at
  // shard block 212 = 4 x 53: 4.
  check_shard(w, {{150 * C, 150 * C}}, 4, {150, C});
  // Rows [100, 200) of three: block 200..399, the change at 56: 8.
  check_shard(w, {{100 * C, 100 * C}}, 8, {100, C});
  // Columns: each row's half of [256, 256] (4 blocks a row, 64 rows a whole
  // scale block: 128 of the shard's blocks each): 128; quarters: 64.
  const Tensor v = make({256, 256}, DType::F32, randn(256 * 256, 22, 0.05));
  for (int64_t ways : {2, 4})
    for (int64_t r = 0; r < ways; ++r) {
      SCOPED_TRACE(::testing::Message() << "columns " << r << " of " << ways);
      std::vector<ops::Nf4Piece> pieces;
      for (int64_t i = 0; i < 256; ++i) pieces.push_back({i * 256 + r * 256 / ways, 256 / ways});
      check_shard(v, pieces, 256 / ways, {256, 256 / ways});
    }
  // Vocabulary padding: the last 10 real rows of [50, 64], then 22 of zeros.
  const Tensor e = make({50, 64}, DType::F32, randn(50 * 64, 23));
  check_shard(e, {{40 * 64, 10 * 64}, {-1, 22 * 64}}, 256, {32, 64});
  // A piece ending in the whole's short last block, and one ending mid-block.
  const Tensor f = make({1000}, DType::F32, randn(1000, 24));
  check_shard(f, {{640, 360}}, 256, {360});
  check_shard(f, {{0, 64}, {128, 37}}, 256, {101});
}

// The fused product and the embedding on a shard: the dense ops on its
// dequantised values (a column shard's scale block is below the whole's).
TEST(Nf4Shard, ProductsAndEmbeddingReadTheShard) {
  const int64_t out = 96, in = 256;
  const Tensor w = make({out, in}, DType::F32, randn(size_t(out * in), 31, 0.05));
  std::vector<ops::Nf4Piece> pieces;
  for (int64_t i = 0; i < out; ++i) pieces.push_back({i * in + in / 2, in / 2});
  ops::Nf4Weight shard =
      ops::Nf4Weight::empty({out, in / 2}, kHost, ops::nf4_shard_scale_block(pieces));
  ASSERT_EQ(shard.scale_block, 128);
  ops::nf4_take_shard(shard, quantized(w), pieces);
  const Tensor dense = dequantized(shard, DType::F32);
  const Tensor x = make({5, in / 2}, DType::F32, randn(size_t(5 * in / 2), 32));
  Tensor y = Tensor::empty({5, out}, DType::F32), y_ref = Tensor::empty({5, out}, DType::F32);
  ops::nf4_linear_forward(y, x, shard, Tensor());
  ops::linear_forward(y_ref, x, dense, Tensor());
  expect_close(values(y), values(y_ref), {1e-5, 0}, "y");
  // Rows [30, 60) of a [60, 64] table as a vocabulary shard: ids of the
  // whole vocabulary, the others' reading zeros (plus positions).
  const int64_t V = 60, C = 64, v0 = 30;
  const Tensor table = make({V, C}, DType::F32, randn(size_t(V * C), 33, 0.5));
  ops::Nf4Weight rows = ops::Nf4Weight::empty({V - v0, C});
  ops::nf4_take_shard(rows, quantized(table), {{v0 * C, (V - v0) * C}});
  const Tensor tokens = make_i32({2, 3}, {0, 31, 59, 29, 30, 45});
  const Tensor wpe = make({3, C}, DType::F32, randn(size_t(3 * C), 34));
  for (const Tensor& p : {Tensor(), wpe}) {
    Tensor got = Tensor::empty({2, 3, C}, DType::F32), want = Tensor::empty({2, 3, C}, DType::F32);
    ops::nf4_embedding_forward(got, tokens, rows, p, Tensor(), v0);
    ops::embedding_forward(want, tokens, dequantized(rows, DType::F32), p, Tensor(), v0);
    EXPECT_EQ(bytes_of(got), bytes_of(want));
  }
}

// A vocabulary shard's real rows (the head scores those alone): views of
// the shard's storage reading as its first rows, an odd count among them.
TEST(Nf4Shard, FirstRowsReadAsTheWeightsFirstRows) {
  for (const Shape& shape : {Shape{40, 64}, Shape{9, 37}}) {
    const ops::Nf4Weight q =
        quantized(make(shape, DType::F32, randn(size_t(shape_numel(shape)), 41)));
    const std::vector<double> all = values(dequantized(q, DType::F32));
    for (int64_t rows : {int64_t(1), int64_t(3), shape[0]}) {
      const ops::Nf4Weight head = q.first_rows(rows);
      EXPECT_EQ(head.codes.raw(), q.codes.raw());  // a view, not a copy
      EXPECT_EQ(values(dequantized(head, DType::F32)),
                std::vector<double>(all.begin(), all.begin() + rows * shape[1]));
      const Tensor x = make({2, shape[1]}, DType::F32, randn(size_t(2 * shape[1]), 42));
      Tensor y = Tensor::empty({2, rows}, DType::F32), y_ref = Tensor::empty({2, rows}, DType::F32);
      ops::nf4_linear_forward(y, x, head, Tensor());
      ops::linear_forward(y_ref, x, dequantized(head, DType::F32), Tensor());
      expect_close(values(y), values(y_ref), {1e-5, 0}, "y");
    }
  }
}

// The scale block is the largest that serves: the shard cut with it, and
// not with twice it (random whole-block pieces of a 64 x 1024 weight, in
// any order, with zero pieces among them).
TEST(Nf4Shard, ScaleBlockIsTheLargestThatServes) {
  const int64_t n = 64 * 1024, blocks = n / ops::kNf4Block;
  const ops::Nf4Weight whole = quantized(make({n}, DType::F32, randn(size_t(n), 51)));
  Rng r(52);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<ops::Nf4Piece> pieces;
    int64_t values = 0;
    for (int k = 0, count = 1 + int(r.below(6)); k < count; ++k) {
      const int64_t len = (1 + int64_t(r.below(trial % 2 ? 40 : 400))) * ops::kNf4Block;
      const int64_t start =
          r.below(5) == 0 ? -1 : int64_t(r.below(uint64_t(blocks))) * ops::kNf4Block;
      pieces.push_back({start, start < 0 ? len : std::min(len, n - start)});
      values += pieces.back().len;
    }
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    const int64_t size = ops::nf4_shard_scale_block(pieces);
    ops::Nf4Weight shard = ops::Nf4Weight::empty({values}, kHost, size);
    ops::nf4_take_shard(shard, whole, pieces);  // (its own check: each scale serves)
    if (size < ops::kNf4ScaleBlock) {
      ops::Nf4Weight wider = ops::Nf4Weight::empty({values}, kHost, 2 * size);
      EXPECT_THROW(ops::nf4_take_shard(wider, whole, pieces), InternalError) << size;
    }
  }
}

TEST(Nf4Shard, PiecesMustBeWholeBlocks) {
  using P = std::vector<ops::Nf4Piece>;
  EXPECT_EQ(ops::nf4_pieces_misaligned(P{{0, 64}, {128, 64}, {-1, 10}}), -1);
  EXPECT_EQ(ops::nf4_pieces_misaligned(P{{0, 128}, {256, 33}}), -1);  // the last may be short
  EXPECT_EQ(ops::nf4_pieces_misaligned(P{{32, 64}}), 0);              // starts mid-block
  EXPECT_EQ(ops::nf4_pieces_misaligned(P{{0, 64}, {64, 32}, {128, 64}}), 1);
  // A shard's storage is a shard's: nf4_quantize writes whole weights only.
  ops::Nf4Weight q = ops::Nf4Weight::empty({64}, kHost, 64);
  EXPECT_THROW(ops::nf4_quantize(q, make({64}, DType::F32, randn(64, 1))), InternalError);
}

// ---- storage, error, bad input ----

TEST(Nf4, StorageIsAboutHalfAByteAValue) {
  // ops.h: 0.5 + 1/64 + 4/16384 bytes a value, plus the 4-byte offset.
  const ops::Nf4Weight q = ops::Nf4Weight::empty({2048, 2048});
  const int64_t n = 2048 * 2048;
  EXPECT_EQ(q.nbytes(), size_t(n / 2 + n / 64 + 4 * (n / 64 / 256) + 4));
  EXPECT_EQ(q.nbytes(), 2163716u);
  EXPECT_NEAR(double(q.nbytes()) / double(n), 0.516, 0.0005);
  // Short blocks round up: 65 values are 33 bytes of codes, 2 blocks, 1 scale.
  EXPECT_EQ(ops::Nf4Weight::empty({5, 13}).nbytes(), size_t(33 + 2 + 4 + 4));
}

// NF4 is near optimal for normal data: QLoRA's levels are its quantiles. On
// N(0, 1) in blocks of 64 the mean absolute error is 0.0913 of the mean
// absolute value (the reference quantiser gives the same on 2^20 samples); we
// require < 0.095, and less than the error of a uniform symmetric 4-bit
// absmax code (round(7 w / absmax) / 7, 0.1145) on the same data.
TEST(Nf4, QuantisationErrorOnNormalDataIsSmall) {
  const size_t n = size_t(1) << 20;
  const std::vector<double> w = rounded(randn(n, 42), DType::F32);
  const std::vector<double> got =
      values(dequantized(quantized(make({int64_t(n)}, DType::F32, w)), DType::F32));
  double err = 0, mag = 0, uniform_err = 0;
  for (size_t b = 0; b < n; b += 64) {
    double amax = 0;
    for (size_t i = b; i < b + 64; ++i) amax = std::max(amax, std::fabs(w[i]));
    for (size_t i = b; i < b + 64; ++i) {
      err += std::fabs(got[i] - w[i]);
      mag += std::fabs(w[i]);
      uniform_err += std::fabs(std::round(w[i] / amax * 7) / 7 * amax - w[i]);
    }
  }
  EXPECT_LT(err / mag, 0.095);
  EXPECT_LT(err, uniform_err);
}

// A NaN or infinity is named by its index, and the weight is left as it was.
TEST(Nf4, NonFiniteWeightIsAUserError) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> w(200, 0.5f);
    ops::Nf4Weight q = quantized(f32_tensor(w));
    const std::string before = storage_bytes(q);
    w[130] = -3.f;
    w[131] = bad;
    const std::string msg = error_of([&] { ops::nf4_quantize(q, f32_tensor(w)); });
    EXPECT_TRUE(contains(msg, "nf4_quantize") && contains(msg, "flat index 131")) << msg;
    EXPECT_EQ(storage_bytes(q), before);
  }
}

// The message of the InternalError (a caller's mistake: shapes, dtypes) f() throws.
template <class F>
std::string check_failure(F&& f) {
  try {
    f();
  } catch (const InternalError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Nf4, BadShapesAndDtypesNameTheTensor) {
  const ops::Nf4Weight q = quantized(make({20, 96}, DType::F32, randn(20 * 96, 1)));
  const Tensor x = make({3, 96}, DType::F32, randn(3 * 96, 2));
  Tensor y = Tensor::empty({3, 20}, DType::F32), dx = Tensor::empty({3, 96}, DType::F32);
  auto expect_names = [](const std::string& msg, const std::string& name) {
    EXPECT_TRUE(contains(msg, name)) << "wanted '" << name << "' in: " << msg;
  };
  // nf4_quantize
  ops::Nf4Weight q2 = ops::Nf4Weight::empty({20, 96});
  expect_names(check_failure([&] {
                 ops::nf4_quantize(q2, make({96, 20}, DType::F32, randn(1920, 3)));
               }),
               "w is f32[96, 20]");
  expect_names(check_failure([&] {
                 ops::nf4_quantize(q2, make({20, 96}, DType::BF16, randn(1920, 3)));
               }),
               "nf4_quantize w");
  ops::Nf4Weight none;
  expect_names(check_failure([&] { ops::nf4_quantize(none, x); }), "undefined NF4 weight");
  EXPECT_THROW(ops::Nf4Weight::empty({0, 4}), InternalError);
  // A weight whose parts do not match its shape.
  ops::Nf4Weight broken = q;
  broken.absmax_codes = Tensor::empty({3}, DType::U8);
  expect_names(check_failure([&] { ops::nf4_linear_forward(y, x, broken, Tensor()); }),
               "w.absmax_codes is u8[3]");
  // nf4_dequantize
  expect_names(check_failure([&] { ops::nf4_dequantize(Tensor::empty({4}, DType::I32), q); }),
               "out is i32[4]");
  expect_names(check_failure([&] { ops::nf4_dequantize(Tensor::empty({4}, DType::F32), q, 1918); }),
               "start 1918");
  expect_names(check_failure([&] { ops::nf4_dequantize(Tensor::empty({4}, DType::F32), q, -1); }),
               "start -1");
  // nf4_linear_forward
  expect_names(check_failure([&] {
                 ops::nf4_linear_forward(y, make({3, 95}, DType::F32, randn(285, 4)), q, Tensor());
               }),
               "x is f32[3, 95]");
  expect_names(check_failure([&] {
                 ops::nf4_linear_forward(Tensor::empty({3, 21}, DType::F32), x, q, Tensor());
               }),
               "y is f32[3, 21]");
  expect_names(check_failure([&] {
                 ops::nf4_linear_forward(Tensor::empty({3, 20}, DType::BF16), x, q, Tensor());
               }),
               "nf4_linear_forward y");
  expect_names(
      check_failure([&] { ops::nf4_linear_forward(y, x, q, Tensor::empty({21}, DType::F32)); }),
      "nf4_linear_forward b");
  expect_names(check_failure([&] {
                 ops::nf4_linear_forward(y, x, quantized(make({2, 3, 4}, DType::F32, randn(24, 5))),
                                         Tensor());
               }),
               "w has shape [2, 3, 4]");
  // nf4_linear_backward_input
  expect_names(check_failure([&] {
                 ops::nf4_linear_backward_input(Tensor::empty({3, 97}, DType::F32), y, q);
               }),
               "dx is f32[3, 97]");
  expect_names(check_failure([&] {
                 ops::nf4_linear_backward_input(dx, Tensor::empty({3, 20}, DType::I32), q);
               }),
               "dy is i32[3, 20]");
  // nf4_embedding_forward
  const Tensor tok = make_i32({1, 2}, {0, 1});
  expect_names(
      check_failure([&] {
        ops::nf4_embedding_forward(Tensor::empty({1, 2, 95}, DType::F32), tok, q, Tensor());
      }),
      "out has shape [1, 2, 95]");
  expect_names(check_failure([&] {
                 ops::nf4_embedding_forward(Tensor::empty({1, 2, 96}, DType::F32), tok, q,
                                            Tensor::empty({4, 96}, DType::BF16));
               }),
               "wpe is bf16");
  expect_names(check_failure([&] {
                 ops::nf4_embedding_forward(Tensor::empty({1, 2, 96}, DType::F32),
                                            Tensor::empty({1, 2}, DType::F32), q, Tensor());
               }),
               "tokens is f32");
}

}  // namespace
}  // namespace nk
