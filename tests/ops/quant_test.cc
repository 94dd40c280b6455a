// Quantised weights (ops/quant.h): the byte layouts pinned by handcrafted
// blocks, Q8_0 and Q4_0 quantisation byte for byte against in-test
// transcriptions of their rules, the quantisation error of every type on
// Gaussian weights, the embedding, and bad input (the products:
// quant_linear_test.cc). CPU only (the ops have no other kernel), so plain
// tests.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "ops/op_harness.h"
#include "ops/ops.h"
#include "ops/quant.h"
#include "quant_test_util.h"
#include "test_util.h"

namespace nk {
namespace {

using namespace test;        // make, randn, values, error_of, contains
using namespace quant_test;  // kAllTypes, quantized, dequantized, ...

std::string storage_bytes(const ops::QuantWeight& q) {
  return bytes_of(q.data) + (q.scale.defined() ? bytes_of(q.scale) : "");
}

// A weight of one row whose bytes are `bytes` (a handcrafted block).
ops::QuantWeight from_bytes(QuantType t, int64_t in, const std::vector<uint8_t>& bytes) {
  ops::QuantWeight q = ops::QuantWeight::empty(t, {1, in});
  EXPECT_EQ(q.data.nbytes(), bytes.size());
  std::memcpy(q.data.raw(), bytes.data(), bytes.size());
  return q;
}

std::vector<float> row_values(const ops::QuantWeight& q) {
  const std::vector<double> v = values(dequantized(q));
  return std::vector<float>(v.begin(), v.end());
}

void put_f16(std::vector<uint8_t>& b, size_t at, float v) {
  const uint16_t h = f32_to_f16(v).bits;
  b[at] = uint8_t(h & 255);
  b[at + 1] = uint8_t(h >> 8);
}

// ---- names and sizes ----

TEST(Quant, NamesBlocksAndRowBytes) {
  const char* names[] = {"q8_0", "q4_0", "q4_k", "q6_k", "w8a16", "w8a8", "f16", "bf16"};
  const int64_t blocks[] = {32, 32, 256, 256, 1, 1, 1, 1};
  const size_t bytes_4096[] = {128 * 34, 128 * 18, 16 * 144, 16 * 210, 4096, 4096, 8192, 8192};
  static_assert(std::size(names) == std::size(kAllTypes));
  for (size_t i = 0; i < std::size(names); ++i) {
    EXPECT_STREQ(ops::quant_type_name(kAllTypes[i]), names[i]);
    EXPECT_EQ(ops::parse_quant_type(names[i]), kAllTypes[i]);
    EXPECT_EQ(ops::quant_block(kAllTypes[i]), blocks[i]);
    EXPECT_EQ(ops::quant_row_bytes(kAllTypes[i], 4096), bytes_4096[i]);
  }
  const std::string msg = error_of([] { ops::parse_quant_type("q5_k"); });
  EXPECT_TRUE(contains(msg, "'q5_k'") && contains(msg, "q8_0, q4_0, q4_k, q6_k, w8a16, w8a8"))
      << msg;
  EXPECT_TRUE(contains(error_of([] { ops::quant_row_bytes(QuantType::Q4_K, 300); }),
                       "300 values is not a whole number of 256-value blocks"));
  // Storage: 8.5, 4.5, 4.5 and 6.5625 bits a value; W8: a byte plus a scale a row.
  EXPECT_EQ(ops::QuantWeight::empty(QuantType::Q4_K, {3, 512}).nbytes(), size_t(3 * 2 * 144));
  EXPECT_EQ(ops::QuantWeight::empty(QuantType::W8A8, {3, 7}).nbytes(), size_t(3 * 7 + 3 * 4));
  EXPECT_FALSE(ops::QuantWeight::empty(QuantType::Q8_0, {2, 32}).scale.defined());
  for (const Shape& bad : {Shape{4, 100}, Shape{4}, Shape{0, 32}, Shape{2, 32, 32}}) {
    const std::string m = error_of([&] { ops::QuantWeight::empty(QuantType::Q8_0, bad); });
    EXPECT_TRUE(contains(m, "QuantWeight::empty") && contains(m, shape_str(bad))) << m;
  }
}

// ---- the layouts, pinned by handcrafted bytes ----

TEST(Quant, HandcraftedQ8_0AndQ4_0Blocks) {
  // Q8_0: d = 0.5, q = -127, -1, 0, 1, 127, then j - 16.
  std::vector<uint8_t> q8(34);
  put_f16(q8, 0, 0.5f);
  const int8_t head[] = {-127, -1, 0, 1, 127};
  for (int j = 0; j < 32; ++j) q8[2 + size_t(j)] = uint8_t(j < 5 ? head[j] : int8_t(j - 16));
  const std::vector<float> v8 = row_values(from_bytes(QuantType::Q8_0, 32, q8));
  EXPECT_EQ(v8[0], -63.5f);
  EXPECT_EQ(v8[1], -0.5f);
  EXPECT_EQ(v8[2], 0.f);
  EXPECT_EQ(v8[4], 63.5f);
  EXPECT_EQ(v8[31], 7.5f);
  // Q4_0: d = 0.25; byte j = (15 - j) << 4 | j: value j is (j - 8) / 4,
  // value 16 + j is (7 - j) / 4.
  std::vector<uint8_t> q4(18);
  put_f16(q4, 0, 0.25f);
  for (int j = 0; j < 16; ++j) q4[2 + size_t(j)] = uint8_t((15 - j) << 4 | j);
  const std::vector<float> v4 = row_values(from_bytes(QuantType::Q4_0, 32, q4));
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(v4[size_t(j)], float(j - 8) / 4) << j;
    EXPECT_EQ(v4[size_t(16 + j)], float(7 - j) / 4) << j;
  }
}

// Q4_K with d = 0.5, dmin = 0.25, sub-block scales sc and mins m below,
// packed into the 12 scale bytes by hand from the layout's rule.
TEST(Quant, HandcraftedQ4_KBlock) {
  const int sc[8] = {1, 2, 3, 4, 17, 33, 63, 50}, m[8] = {0, 5, 10, 63, 16, 40, 1, 32};
  // s[j] = sc[j] | (sc[j+4] >> 4) << 6; s[j+4] = m[j] | (m[j+4] >> 4) << 6;
  // s[j+8] = (sc[j+4] & 15) | (m[j+4] & 15) << 4.
  const uint8_t scales[12] = {0x41, 0x82, 0xC3, 0xC4, 0x40, 0x85,
                              0x0A, 0xBF, 0x01, 0x81, 0x1F, 0x02};
  std::vector<uint8_t> b(144);
  put_f16(b, 0, 0.5f);
  put_f16(b, 2, 0.25f);
  std::memcpy(&b[4], scales, 12);
  for (int i = 0; i < 128; ++i) b[16 + size_t(i)] = uint8_t(i * 7 + 3);
  const std::vector<float> v = row_values(from_bytes(QuantType::Q4_K, 256, b));
  // Value 64 c + i: low nibble of qs[32 c + i], sub-block 2 c; 64 c + 32 + i: high, 2 c + 1.
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 32; ++i) {
      const int byte = ((32 * c + i) * 7 + 3) & 255;
      const int j0 = 2 * c, j1 = 2 * c + 1;
      EXPECT_EQ(v[size_t(64 * c + i)], 0.5f * float(sc[j0] * (byte & 15)) - 0.25f * float(m[j0]));
      EXPECT_EQ(v[size_t(64 * c + 32 + i)],
                0.5f * float(sc[j1] * (byte >> 4)) - 0.25f * float(m[j1]));
    }
  // Spot values: value 0: byte 3, q 3, sub-block 0: 0.5 * 1 * 3 - 0 = 1.5.
  // Value 255: c 3, i 31, byte (127 * 7 + 3) & 255 = 124, high nibble 7,
  // sub-block 7: 0.5 * 50 * 7 - 0.25 * 32 = 167.
  EXPECT_EQ(v[0], 1.5f);
  EXPECT_EQ(v[255], 167.f);
  // Sub-block 3 (values 96..127: c 1, high nibbles): value 100 is qs[36] = (36 * 7 + 3) & 255 =
  // 255, high nibble 15: 0.5 * 4 * 15 - 0.25 * 63.
  EXPECT_EQ(v[100], 30.f - 15.75f);
}

// Q6_K with d = 0.5, 16 signed scales, ql[j] = j, qh[j] = 37 j mod 256.
TEST(Quant, HandcraftedQ6_KBlock) {
  const int8_t sc[16] = {1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, -7, 127, -128};
  std::vector<uint8_t> b(210);
  for (int j = 0; j < 128; ++j) b[size_t(j)] = uint8_t(j);
  for (int j = 0; j < 64; ++j) b[128 + size_t(j)] = uint8_t(37 * j);
  std::memcpy(&b[192], sc, 16);
  put_f16(b, 208, 0.5f);
  const std::vector<float> v = row_values(from_bytes(QuantType::Q6_K, 256, b));
  // In half h, value 32 k + l: low nibble (k < 2) or high nibble (k >= 2) of
  // ql[64 h + l + 32 (k & 1)], high bits (qh[32 h + l] >> 2 k) & 3.
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const int lo = b[size_t(64 * h + l + 32 * (k & 1))];
        const int hi = (b[128 + size_t(32 * h + l)] >> (2 * k)) & 3;
        const int q = (k < 2 ? lo & 15 : lo >> 4) | hi << 4;
        const int at = 128 * h + 32 * k + l;
        EXPECT_EQ(v[size_t(at)], 0.5f * float(sc[at / 16]) * float(q - 32)) << at;
      }
  // By hand: value 0: ql[0] = 0, qh[0] = 0: q 0, 0.5 * 1 * -32 = -16.
  // Value 200 (h 1, k 2, l 8): ql[72] = 72 >> 4 = 4, qh[40] = 1480 mod 256 =
  // 200 = 0b11001000, bits 4-5 = 0: q 4, scale 7: 0.5 * 7 * -28 = -98.
  // Value 47 (h 0, k 1, l 15): ql[47] & 15 = 15, qh[15] = 555 mod 256 = 43 =
  // 0b101011, bits 2-3 = 2: q 47, scale 47 / 16 = 2: 0.5 * 2 * 15 = 15.
  EXPECT_EQ(v[0], -16.f);
  EXPECT_EQ(v[200], -98.f);
  EXPECT_EQ(v[47], 15.f);
}

// The products decode the same layouts: one-hot x picks a column of W (x's
// 8-bit block is then exact: 127 * (1 / 127)).
TEST(Quant, ProductsReadHandcraftedBlocksAsTheLayoutSays) {
  std::vector<uint8_t> k4(2 * 144), k6(2 * 210);
  Rng r(3);
  for (auto& c : k4) c = uint8_t(r.below(256));
  for (auto& c : k6) c = uint8_t(r.below(256));
  for (size_t s : {size_t(0), size_t(144)}) {  // finite, moderate scales
    put_f16(k4, s, 0.01f);
    put_f16(k4, s + 2, 0.02f);
  }
  for (size_t s : {size_t(208), size_t(418)}) put_f16(k6, s, 0.001f);
  for (const auto& [type, bytes] :
       {std::pair{QuantType::Q4_K, k4}, std::pair{QuantType::Q6_K, k6}}) {
    ops::QuantWeight q = ops::QuantWeight::empty(type, {2, 256});
    std::memcpy(q.data.raw(), bytes.data(), bytes.size());
    const std::vector<double> w = values(dequantized(q));
    for (int64_t col : {0, 1, 17, 100, 255}) {
      std::vector<double> x(256, 0.0);
      x[size_t(col)] = 1.0;
      Tensor y = Tensor::empty({1, 2}, DType::F32);
      ops::quant_linear_forward(y, make({1, 256}, DType::F32, x), q, Tensor());
      const std::vector<double> got = values(y);
      for (int o = 0; o < 2; ++o)
        // |w| < 11: a few f32 roundings of the scale products apart.
        EXPECT_NEAR(got[size_t(o)], w[size_t(o * 256 + col)], 1e-5)
            << ops::quant_type_name(type) << " row " << o << " column " << col;
    }
  }
}

// Random blocks (random bytes, finite f16 scales) read back bit for bit as
// the layouts define them, each product rounded to f32 on its own (volatile
// here: this file may be compiled with FMA contraction). Q6_K's (d sc) (q -
// 32) needs up to 25 bits, so its order of operations shows.
TEST(Quant, DequantisedValuesAreTheLayoutFormulasBitForBit) {
  Rng r(21);
  auto scale = [&] {
    return f32_to_f16(float((r.uniform() * 2 - 1) * std::pow(10.0, -3 + 3 * r.uniform())));
  };
  auto rounded = [](float v) {
    volatile float k = v;
    return float(k);
  };
  const int nb = 7;
  std::vector<uint8_t> k4(nb * 144), k6(nb * 210);
  for (auto& c : k4) c = uint8_t(r.below(256));
  for (auto& c : k6) c = uint8_t(r.below(256));
  for (int b = 0; b < nb; ++b) {
    const uint16_t d = scale().bits, dmin = scale().bits, d6 = scale().bits;
    std::memcpy(&k4[size_t(b) * 144], &d, 2);
    std::memcpy(&k4[size_t(b) * 144 + 2], &dmin, 2);
    std::memcpy(&k6[size_t(b) * 210 + 208], &d6, 2);
  }
  const std::vector<float> v4 = row_values(from_bytes(QuantType::Q4_K, nb * 256, k4));
  const std::vector<float> v6 = row_values(from_bytes(QuantType::Q6_K, nb * 256, k6));
  for (int b = 0; b < nb; ++b) {
    const uint8_t* x4 = &k4[size_t(b) * 144];
    const uint8_t* s = x4 + 4;
    const float d = f16_to_f32(f16{uint16_t(x4[0] | x4[1] << 8)});
    const float dmin = f16_to_f32(f16{uint16_t(x4[2] | x4[3] << 8)});
    for (int j = 0; j < 8; ++j) {
      const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
      const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | (s[j] >> 6) << 4;
      const float d1 = rounded(d * float(sc)), m1 = rounded(dmin * float(m));
      for (int i = 0; i < 32; ++i) {
        const uint8_t byte = x4[16 + 32 * (j / 2) + i];
        const int q = j % 2 ? byte >> 4 : byte & 15;
        ASSERT_EQ(v4[size_t(b * 256 + 32 * j + i)], rounded(d1 * float(q)) - m1)
            << "q4_k block " << b << " sub-block " << j << " value " << i;
      }
    }
    const uint8_t* x6 = &k6[size_t(b) * 210];
    const float d6 = f16_to_f32(f16{uint16_t(x6[208] | x6[209] << 8)});
    for (int v = 0; v < 256; ++v) {
      const int h = v / 128, k = v % 128 / 32, l = v % 32;
      const int lo = x6[64 * h + l + 32 * (k & 1)], hi = (x6[128 + 32 * h + l] >> (2 * k)) & 3;
      const int q = (k < 2 ? lo & 15 : lo >> 4) | hi << 4;
      const float s6 = rounded(d6 * float(int8_t(x6[192 + v / 16])));
      ASSERT_EQ(v6[size_t(b * 256 + v)], s6 * float(q - 32))
          << "q6_k block " << b << " value " << v;
    }
  }
}

// ---- quantisers ----

// Q8_0 (ops/quant.h): d = max|x| / 127 rounded to f16, q = nearest-even of
// x (1 / d) with the stored d, clamped to +-127; an all-zero block is d = 0, q = 0.
std::vector<uint8_t> q8_0_by_rule(const float* x) {
  float amax = 0.f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const uint16_t h = f32_to_f16(amax / 127.f).bits;
  const float d = f16_to_f32(f16{h});
  std::vector<uint8_t> b = {uint8_t(h & 255), uint8_t(h >> 8)};
  for (int j = 0; j < 32; ++j)
    b.push_back(uint8_t(
        d == 0.f ? 0 : int8_t(std::clamp(std::nearbyint(x[j] * (1.f / d)), -127.f, 127.f))));
  return b;
}

// ggml's quantize_row_q4_0_ref: d = (value of largest magnitude) / -8, id =
// 1 / d, q = min(15, (int8) (x id + 8.5)), the product rounded before the sum.
std::vector<uint8_t> q4_0_by_rule(const float* x) {
  float amax = 0.f, vmax = 0.f;
  for (int j = 0; j < 32; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      vmax = x[j];
    }
  const float d = vmax / -8.f, id = d != 0.f ? 1.f / d : 0.f;
  const uint16_t h = f32_to_f16(d).bits;
  std::vector<uint8_t> b = {uint8_t(h & 255), uint8_t(h >> 8)};
  auto level = [&](float v) {
    volatile float p = v * id;
    return std::min(15, int(int8_t(p + 8.5f)));
  };
  for (int j = 0; j < 16; ++j) b.push_back(uint8_t(level(x[j]) | level(x[j + 16]) << 4));
  return b;
}

// A value whose product with id rounds in f32 to exactly `target` (a
// negative half-integer) while the exact product is below it: ggml rounds
// the product before adding 8.5, giving an integer, where an FMA would give
// just under it (representable near 1, 2, ...) and truncate to one less.
float below_tie(float id, float target) {
  float x = target / id;
  for (int i = 0; i < 64; ++i) x = std::nextafter(x, 0.f);
  for (int i = 0; i < 128; ++i, x = std::nextafter(x, -1e9f)) {
    volatile float p = x * id;
    if (p == target && double(x) * double(id) < double(target)) return x;
  }
  return 0.f;
}

// Gaussian rows, one all-zero block, exact ties of Q4_0's rounding, a block
// whose largest magnitude is positive, and products that round onto a tie.
std::vector<float> rule_case() {
  std::vector<float> w = gaussian(8 * 256, 11, 0.05);
  std::fill(w.begin() + 64, w.begin() + 96, 0.f);
  for (int j = 0; j < 32; ++j) w[size_t(128 + j)] = float(j % 17 - 8) * 0.125f;  // max -1: d 0.125
  w[200] = 3.f;
  // Block 7: max -7, d = 0.875, id = 1 / d not exact.
  float* b7 = &w[7 * 32];
  std::fill(b7, b7 + 32, 0.f);
  b7[0] = -7.f;
  const float id = 1.f / (-7.f / -8.f);
  int found = 0;
  for (int k = 1; k < 31; ++k) {
    const float target = float(k % 8) - 7.5f;  // -7.5 .. -0.5
    const float x = below_tie(id, target);
    b7[k] = x;
    found += x != 0.f;
  }
  EXPECT_GT(found, 5) << "no products rounding onto a tie found";
  return w;
}

NK_COVERS(Quant, Q8_0AndQ4_0AreTheirRulesByteForByte, quant_quantize);
TEST(Quant, Q8_0AndQ4_0AreTheirRulesByteForByte) {
  const std::vector<float> w = rule_case();
  const Tensor t = f32_tensor({8, 256}, w);
  for (QuantType type : {QuantType::Q8_0, QuantType::Q4_0}) {
    SCOPED_TRACE(ops::quant_type_name(type));
    std::string want;
    for (size_t b = 0; b < w.size() / 32; ++b) {
      const auto bytes =
          type == QuantType::Q8_0 ? q8_0_by_rule(&w[b * 32]) : q4_0_by_rule(&w[b * 32]);
      want.append(bytes.begin(), bytes.end());
    }
    EXPECT_EQ(bytes_of(quantized(type, t).data), want);
  }
  // The zero block reads back as zeros, d = 0.
  const ops::QuantWeight q = quantized(QuantType::Q8_0, t);
  const uint8_t* z = q.data.data<uint8_t>() + 2 * 34;
  EXPECT_TRUE(std::all_of(z, z + 34, [](uint8_t c) { return c == 0; }));
}

// Relative RMS error sqrt(sum (w - w')^2 / sum w^2) on N(0, 1) weights, 64 x
// 4096, as measured with these quantisers, and the bounds (~10% above):
//   q8_0  0.00537  |x - d q| <= d / 2 with d = max|x| / 127 over 32 values
//                  (E max ~2.07): uniform error 2.07 / 127 / sqrt(12) ~ 0.0047,
//                  plus the f16 rounding of d;
//   q4_0  0.0862   ggml's rule: d = max / -8, 16 levels spanning [-8, 7] d;
//   q4_k  0.0700   asymmetric 16 levels per 32 values, (scale, min) fitted,
//                  then coded in 6 bits against f16 super-block scales;
//   q6_k  0.0172   64 levels per 16 values, scales fitted, 8-bit codes;
//   w8    0.00872  one scale per row of 4096 (max ~4): 4 / 127 / sqrt(12).
// The targets asked for were q4_k <= 0.10, q6_k <= 0.025, q4_0 <= 0.12,
// q8_0 <= 0.006.
TEST(Quant, ErrorOnGaussianWeights) {
  const int64_t out = 64, in = 4096;
  const std::vector<float> w = gaussian(size_t(out * in), 42);
  const Tensor t = f32_tensor({out, in}, w);
  const struct {
    QuantType type;
    double bound;
  } cases[] = {{QuantType::Q8_0, 0.0059}, {QuantType::Q4_0, 0.095},   {QuantType::Q4_K, 0.077},
               {QuantType::Q6_K, 0.019},  {QuantType::W8A16, 0.0096}, {QuantType::W8A8, 0.0096},
               {QuantType::F16, 3.2e-4},    // f16: 2^-11 / sqrt(3) = 2.8e-4 for uniform rounding
               {QuantType::BF16, 2.6e-3}};  // bf16: 2^-8 / sqrt(3) = 2.3e-3
  for (const auto& c : cases) {
    const std::vector<double> back = values(dequantized(quantized(c.type, t)));
    double err = 0, mag = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      err += (back[i] - w[i]) * (back[i] - w[i]);
      mag += double(w[i]) * w[i];
    }
    const double rel = std::sqrt(err / mag);
    RecordProperty(std::string("rel_rms_") + ops::quant_type_name(c.type), std::to_string(rel));
    EXPECT_LT(rel, c.bound) << ops::quant_type_name(c.type);
  }
}

// K types' searches and every type's rows: the same bytes on any thread count.
TEST(Quant, QuantizeIsTheSameOnAnyThreadCount) {
  const Tensor t = f32_tensor({24, 512}, gaussian(24 * 512, 5, 0.02));
  const int saved = num_threads();
  for (QuantType type : kAllTypes) {
    std::vector<std::string> runs;
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      runs.push_back(storage_bytes(quantized(type, t)));
    }
    EXPECT_EQ(runs[0], runs[1]) << ops::quant_type_name(type);
  }
  set_num_threads(saved);
}

TEST(Quant, W8ScalesAndZeroRows) {
  std::vector<float> w = gaussian(3 * 40, 8);
  std::fill(w.begin() + 40, w.begin() + 80, 0.f);
  const ops::QuantWeight q = quantized(QuantType::W8A16, f32_tensor({3, 40}, w));
  const float* s = q.scale.data<float>();
  const int8_t* d = reinterpret_cast<const int8_t*>(q.data.raw());
  for (int r = 0; r < 3; ++r) {
    float amax = 0.f;
    for (int c = 0; c < 40; ++c) amax = std::max(amax, std::fabs(w[size_t(r * 40 + c)]));
    EXPECT_EQ(s[r], amax / 127.f);
    for (int c = 0; c < 40; ++c) {
      const float want = s[r] > 0 ? std::round(w[size_t(r * 40 + c)] / s[r]) : 0.f;
      EXPECT_EQ(d[r * 40 + c], int8_t(want)) << r << "," << c;
    }
  }
  EXPECT_EQ(s[1], 0.f);
}

NK_COVERS(Quant, DequantizesRowRangesInBothDtypes, quant_dequantize);
TEST(Quant, DequantizesRowRangesInBothDtypes) {
  for (QuantType type : kAllTypes) {
    SCOPED_TRACE(ops::quant_type_name(type));
    const ops::QuantWeight q = quantized(type, f32_tensor({9, 512}, gaussian(9 * 512, 6)));
    const std::vector<double> all = values(dequantized(q));
    Tensor part = Tensor::empty({3, 512}, DType::BF16);
    ops::quant_dequantize(part, q, 5);
    const std::vector<double> got = values(part);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], double(bf16_to_f32(f32_to_bf16(float(all[5 * 512 + i]))))) << i;
  }
}

// ---- the packed layout (QuantLayout::Packed16) ----

// Bytes of the unit at byte o of a row, from ops/quant.h's words: a block's
// f16 scale (Q8_0, Q4_0: bytes 0-1; Q6_K: 208-209) is a unit of 2, the rest
// 4-byte words.
size_t unit_at(QuantType t, size_t o) {
  if (t == QuantType::Q8_0) return o % 34 < 2 ? 2 : 4;
  if (t == QuantType::Q4_0) return o % 18 < 2 ? 2 : 4;
  if (t == QuantType::Q6_K) return o % 210 >= 208 ? 2 : 4;
  return 4;
}

// The packed bytes as ops/quant.h defines them, from the row layout's.
std::string packed_as_documented(QuantType t, const std::string& rows, size_t rb) {
  std::string out(rows.size(), '\0');
  for (size_t g = 0; g < rows.size() / (16 * rb); ++g)
    for (size_t o = 0, u; o < rb; o += u) {
      u = unit_at(t, o);
      for (size_t r = 0; r < 16; ++r)
        out.replace(g * 16 * rb + 16 * o + r * u, u, rows, (g * 16 + r) * rb + o, u);
    }
  return out;
}

// quant_pack reorders the bytes as documented, in place, for the types the
// VNNI tiles serve; every op then reads the same values as from the rows:
// dequantised rows (any range, both dtypes) and embedding rows bit for bit,
// quant_unpacked gives the rows back, and quant_quantize into a packed
// weight writes the packed bytes of the same quantisation. (Products:
// quant_linear_test.cc.)
NK_COVERS(Quant, PackedLayoutHoldsTheSameValues, quant_pack, quant_unpack);
TEST(Quant, PackedLayoutHoldsTheSameValues) {
  int packed_types = 0;
  for (QuantType t : kAllTypes) {
    SCOPED_TRACE(ops::quant_type_name(t));
    const int64_t out = 48, in = 512;
    const Tensor w = f32_tensor({out, in}, gaussian(size_t(out * in), 40));
    const ops::QuantWeight rows = quantized(t, w);
    ops::QuantWeight q = quantized(t, w);
    const void* storage = q.data.raw();
    if (!ops::quant_pack(q)) {
      EXPECT_EQ(q.layout, ops::QuantLayout::Rows);
      EXPECT_EQ(bytes_of(q.data), bytes_of(rows.data));
      continue;
    }
    ++packed_types;
    EXPECT_EQ(q.layout, ops::QuantLayout::Packed16);
    EXPECT_EQ(q.data.raw(), storage);  // in place
    EXPECT_EQ(bytes_of(q.data), packed_as_documented(t, bytes_of(rows.data), rows.row_bytes()));
    EXPECT_NE(bytes_of(q.data), bytes_of(rows.data));
    EXPECT_TRUE(ops::quant_pack(q));  // again: nothing changes
    EXPECT_EQ(bytes_of(q.data), packed_as_documented(t, bytes_of(rows.data), rows.row_bytes()));

    for (DType dt : {DType::F32, DType::BF16}) {
      EXPECT_EQ(bytes_of(dequantized(q, dt)), bytes_of(dequantized(rows, dt)));
      Tensor a = Tensor::empty({7, in}, dt), b = Tensor::empty({7, in}, dt);
      ops::quant_dequantize(a, q, 21);
      ops::quant_dequantize(b, rows, 21);
      EXPECT_EQ(bytes_of(a), bytes_of(b));
      const std::vector<int32_t> tok = {0, 47, 16, 15, 31, 3};
      Tensor ea = Tensor::empty({6, in}, dt), eb = Tensor::empty({6, in}, dt);
      ops::quant_embedding_forward(ea, make_i32({6}, tok), q);
      ops::quant_embedding_forward(eb, make_i32({6}, tok), rows);
      EXPECT_EQ(bytes_of(ea), bytes_of(eb));
    }
    const ops::QuantWeight back = ops::quant_unpacked(q);
    EXPECT_EQ(back.layout, ops::QuantLayout::Rows);
    EXPECT_EQ(bytes_of(back.data), bytes_of(rows.data));
    if (rows.scale.defined()) {
      EXPECT_EQ(bytes_of(back.scale), bytes_of(rows.scale));
    }

    const Tensor w2 = f32_tensor({out, in}, gaussian(size_t(out * in), 41));
    ops::quant_quantize(q, w2);
    EXPECT_EQ(q.layout, ops::QuantLayout::Packed16);
    EXPECT_EQ(bytes_of(q.data),
              packed_as_documented(t, bytes_of(quantized(t, w2).data), rows.row_bytes()));
  }
  if (packed_types == 0) GTEST_SKIP() << "this build does not target AVX-512 VNNI";
  // q8_0, q4_0, q4_k, q6_k, w8a8 (512 a multiple of 32); not w8a16 nor f16.
  EXPECT_EQ(packed_types, 5);
}

// Rows that do not fill groups of 16 stay in the row layout.
TEST(Quant, PackLeavesRowsNotAMultipleOf16) {
  ops::QuantWeight q = quantized(QuantType::Q4_0, f32_tensor({40, 256}, gaussian(40 * 256, 42)));
  const std::string before = bytes_of(q.data);
  EXPECT_FALSE(ops::quant_pack(q));
  EXPECT_EQ(q.layout, ops::QuantLayout::Rows);
  EXPECT_EQ(bytes_of(q.data), before);
}

// ---- embedding ----

NK_COVERS(QuantEmbedding, GathersDequantisedRows, quant_embedding_forward);
TEST(QuantEmbedding, GathersDequantisedRows) {
  const int64_t V = 20, C = 512;
  for (QuantType t : kAllTypes) {
    const ops::QuantWeight wte = quantized(t, f32_tensor({V, C}, gaussian(size_t(V * C), 14)));
    for (DType dt : {DType::F32, DType::BF16}) {
      const Tensor table = dequantized(wte, dt);
      for (const Shape& shape : {Shape{2, 3}, Shape{5}, Shape{1, 2, 2}}) {
        std::vector<int32_t> tok(size_t(shape_numel(shape)));
        for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 7 + 3) % V);
        Shape out_shape = shape;
        out_shape.push_back(C);
        Tensor out = Tensor::empty(out_shape, dt);
        ops::quant_embedding_forward(out, make_i32(shape, tok), wte);
        const std::string got = bytes_of(out), all = bytes_of(table);
        const size_t row = size_t(C) * dtype_size(dt);
        for (size_t i = 0; i < tok.size(); ++i)
          EXPECT_EQ(got.substr(i * row, row), all.substr(size_t(tok[i]) * row, row))
              << ops::quant_type_name(t) << " " << dtype_name(dt) << " token " << i;
      }
    }
  }
}

// One rank's shard of a vocabulary split over tensor-parallel ranks
// (vocab_start): its ids read their row of the shard, the others zeros, so
// the shards' outputs sum to the whole table's lookup.
TEST(QuantEmbedding, VocabularyShardReadsItsIdsAndZeros) {
  const int64_t V = 32, C = 256, half = V / 2;
  for (QuantType t : kAllTypes) {
    const Tensor whole = f32_tensor({V, C}, gaussian(size_t(V * C), 15));
    const ops::QuantWeight wte = quantized(t, whole);
    std::vector<int32_t> tok = {0, 17, 5, 31, 16, 15};
    const Tensor ids = make_i32({6}, tok);
    Tensor want = Tensor::empty({6, C}, DType::F32);
    ops::quant_embedding_forward(want, ids, wte);
    for (int64_t r = 0; r < 2; ++r) {
      // The shard quantised from its own rows: the same blocks (rows are whole).
      const ops::QuantWeight shard = quantized(t, whole.narrow0(r * half, half));
      Tensor out = Tensor::empty({6, C}, DType::F32);
      ops::quant_embedding_forward(out, ids, shard, r * half);
      for (size_t i = 0; i < tok.size(); ++i) {
        const bool mine = tok[i] >= r * half && tok[i] < (r + 1) * half;
        for (int64_t c = 0; c < C; ++c)
          ASSERT_EQ(out.data<float>()[i * C + c], mine ? want.data<float>()[i * C + c] : 0.f)
              << ops::quant_type_name(t) << " rank " << r << " token " << i;
      }
    }
  }
}

// ---- bad input ----

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

void expect_names(const std::string& msg, const std::string& part) {
  EXPECT_TRUE(contains(msg, part)) << "wanted '" << part << "' in: " << msg;
}

TEST(QuantErrors, NonFiniteAndHugeWeightsNameRowAndColumnAndLeaveQ) {
  for (QuantType t : kAllTypes)
    for (float bad : {NAN, INFINITY, -INFINITY, 1e30f, std::numeric_limits<float>::max()}) {
      std::vector<float> w(4 * 256, 0.5f);
      ops::QuantWeight q = quantized(t, f32_tensor({4, 256}, w));
      const std::string before = storage_bytes(q);
      w[2 * 256 + 77] = bad;
      w[3 * 256 + 1] = NAN;
      const std::string msg = error_of([&] { ops::quant_quantize(q, f32_tensor({4, 256}, w)); });
      const bool huge = std::isfinite(bad);
      // f32 scales, or within bf16's range (1e30; FLT_MAX rounds to infinity): fine
      if (huge && (t == QuantType::W8A16 || t == QuantType::W8A8 ||
                   (t == QuantType::BF16 && bad == 1e30f))) {
        expect_names(msg, "row 3, column 1");
        continue;
      }
      expect_names(msg, "quant_quantize");
      expect_names(msg, "row 2, column 77");
      if (huge) expect_names(msg, "too large for");
      EXPECT_EQ(storage_bytes(q), before) << ops::quant_type_name(t);
    }
}

TEST(QuantErrors, EmbeddingTokenOutOfRangeNamesPositionAndValue) {
  const ops::QuantWeight wte = quantized(QuantType::Q8_0, f32_tensor({10, 64}, gaussian(640, 15)));
  Tensor out = Tensor::empty({2, 3, 64}, DType::F32);
  for (int32_t bad : {10, -1}) {
    const Tensor tok = make_i32({2, 3}, {1, 2, 3, 4, bad, 5});
    const std::string msg = error_of([&] { ops::quant_embedding_forward(out, tok, wte); });
    expect_names(msg,
                 "quant_embedding_forward: token id " + std::to_string(bad) + " at position 4");
    expect_names(msg, "[0, 10)");
  }
}

TEST(QuantErrors, BadArgumentsNameOpAndTensor) {
  const ops::QuantWeight q = quantized(QuantType::Q4_0, f32_tensor({20, 96}, gaussian(20 * 96, 1)));
  const Tensor x = make({3, 96}, DType::F32, randn(3 * 96, 2));
  Tensor y = Tensor::empty({3, 20}, DType::F32);
  // quant_quantize
  ops::QuantWeight q2 = ops::QuantWeight::empty(QuantType::Q4_0, {20, 96});
  expect_names(check_failure([&] {
                 ops::quant_quantize(q2, make({96, 20}, DType::F32, randn(1920, 3)));
               }),
               "w is f32[96, 20]");
  expect_names(check_failure([&] {
                 ops::quant_quantize(q2, make({20, 96}, DType::BF16, randn(1920, 3)));
               }),
               "quant_quantize w is bf16");
  ops::QuantWeight none;
  expect_names(check_failure([&] { ops::quant_quantize(none, x); }), "undefined quantised weight");
  ops::QuantWeight w8 = ops::QuantWeight::empty(QuantType::W8A8, {20, 96});
  w8.scale = Tensor();
  expect_names(check_failure([&] { ops::quant_linear_forward(y, x, w8, Tensor()); }),
               "w.scale is undefined, expected f32[20]");
  ops::QuantWeight broken = q;
  broken.data = Tensor::empty({100}, DType::U8);
  expect_names(check_failure([&] { ops::quant_linear_forward(y, x, broken, Tensor()); }),
               "w.data is u8[100], expected u8[1080]");
  // in not a multiple of the block
  ops::QuantWeight odd = q;
  odd.shape = {20, 100};
  expect_names(check_failure([&] {
                 ops::quant_dequantize(Tensor::empty({1, 100}, DType::F32), odd);
               }),
               "with in a multiple of 32");
  // quant_dequantize
  expect_names(check_failure([&] {
                 ops::quant_dequantize(Tensor::empty({1, 96}, DType::I32), q);
               }),
               "out is i32[1, 96]");
  expect_names(check_failure([&] {
                 ops::quant_dequantize(Tensor::empty({2, 96}, DType::F32), q, 19);
               }),
               "row0 19");
  expect_names(check_failure([&] {
                 ops::quant_dequantize(Tensor::empty({2, 95}, DType::F32), q);
               }),
               "out is f32[2, 95], last dim should be 96");
  // quant_linear_forward
  expect_names(
      check_failure([&] {
        ops::quant_linear_forward(y, make({3, 95}, DType::F32, randn(285, 4)), q, Tensor());
      }),
      "quant_linear_forward: x is f32[3, 95]");
  expect_names(
      check_failure([&] {
        ops::quant_linear_forward(y, make_i32({3, 96}, std::vector<int32_t>(288)), q, Tensor());
      }),
      "x is i32[3, 96], expected f32 or bf16");
  expect_names(check_failure([&] {
                 ops::quant_linear_forward(Tensor::empty({3, 21}, DType::F32), x, q, Tensor());
               }),
               "y is f32[3, 21]");
  expect_names(check_failure([&] {
                 ops::quant_linear_forward(Tensor::empty({3, 20}, DType::BF16), x, q, Tensor());
               }),
               "quant_linear_forward y is bf16");
  expect_names(
      check_failure([&] { ops::quant_linear_forward(y, x, q, Tensor::empty({21}, DType::F32)); }),
      "quant_linear_forward b");
  expect_names(
      check_failure([&] { ops::quant_linear_forward(y, x, q, Tensor::empty({20}, DType::F64)); }),
      "b is f64[20], expected f32 or x's dtype");
  // quant_embedding_forward
  const Tensor tok = make_i32({1, 2}, {0, 1});
  expect_names(check_failure([&] {
                 ops::quant_embedding_forward(Tensor::empty({1, 2, 95}, DType::F32), tok, q);
               }),
               "quant_embedding_forward out has shape [1, 2, 95], expected [1, 2, 96]");
  expect_names(check_failure([&] {
                 ops::quant_embedding_forward(Tensor::empty({1, 2, 96}, DType::F32),
                                              Tensor::empty({1, 2}, DType::F32), q);
               }),
               "quant_embedding_forward tokens is f32");
}

}  // namespace
}  // namespace nk
