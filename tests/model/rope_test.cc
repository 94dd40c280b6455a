// RoPE scaling (model/rope.h): the unscaled table is ops::rope_table's bit for
// bit; each scaling type's frequencies fall in the bands its definition
// (transformers' modeling_rope_utils) gives them; the model.rope_scaling.*
// keys and their errors; and incremental decoding over the KV cache equals a
// full recompute for scaled models (Llama with llama3, linear and yarn; Qwen2
// with yarn), whose logits differ from the unscaled model's.
//
// The frequencies here are checked against the definitions pair by pair; the
// logits of scaled models against an independent PyTorch implementation are
// in tests/ckpt/hf_arch_test.cc and torch_parity_test.cc.
#include "model/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numbers>

#include "core/config.h"
#include "model/kv_cache.h"
#include "model/tiny_config.h"
#include "model/transformer.h"
#include "ops/ops.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::error_of;

RopeScaling llama3(double factor, double lo, double hi, int64_t original) {
  RopeScaling s;
  s.type = RopeScalingType::Llama3;
  s.factor = factor;
  s.low_freq_factor = lo;
  s.high_freq_factor = hi;
  s.original_max_seq_len = original;
  return s;
}

RopeScaling yarn(double factor, int64_t original) {
  RopeScaling s;
  s.type = RopeScalingType::Yarn;
  s.factor = factor;
  s.original_max_seq_len = original;
  return s;
}

RopeScaling linear(double factor) {
  RopeScaling s;
  s.type = RopeScalingType::Linear;
  s.factor = factor;
  return s;
}

std::vector<float> host(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  ops::copy_to_host(t, v.data());
  return v;
}

TEST(Rope, UnscaledTableIsOpsTableBitForBit) {
  struct Case {
    int64_t T, D;
    double theta;
  };
  for (Case k : {Case{256, 16, 1e4}, Case{1000, 64, 5e5}, Case{37, 8, 1e6}, Case{4096, 128, 1e4}}) {
    std::vector<float> a = host(ops::rope_table(k.T, k.D, k.theta));
    std::vector<float> b = host(rope_table(k.T, k.D, k.theta, RopeScaling{}, k.T));
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
        << k.T << " x " << k.D << " theta " << k.theta;
  }
}

// theta 100, head size 16: wavelengths 2 pi 10^(i/4) = 6.3, 11.2, 19.9, 35.3,
// 62.8, ... positions.
TEST(Rope, Llama3KeepsHighScalesLowSmoothsMedium) {
  const int64_t D = 16;
  const double theta = 100;
  // Llama 3.1's factors (8, 1, 4) over an original context of 32 positions:
  // wavelengths under 32/4 = 8 are kept, over 32/1 divided by 8, smoothed between.
  RopeScaling s = llama3(8, 1, 4, 32);
  std::vector<double> plain = rope_inv_freq(D, theta, {}, 64), f = rope_inv_freq(D, theta, s, 64);
  int high = 0, medium = 0, low = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const double wavelen = 2 * std::numbers::pi / plain[i];
    if (wavelen < 8) {
      EXPECT_EQ(f[i], plain[i]) << i;
      ++high;
    } else if (wavelen > 32) {
      EXPECT_DOUBLE_EQ(f[i], plain[i] / 8) << i;
      ++low;
    } else {
      const double smooth = (32 / wavelen - 1) / (4 - 1);
      EXPECT_DOUBLE_EQ(f[i], (1 - smooth) * plain[i] / 8 + smooth * plain[i]) << i;
      EXPECT_LT(f[i], plain[i]);
      EXPECT_GT(f[i], plain[i] / 8);
      ++medium;
    }
  }
  EXPECT_EQ(high, 1);
  EXPECT_EQ(medium, 2);
  EXPECT_EQ(low, 5);
  EXPECT_EQ(rope_attention_factor(s), 1.0);
}

TEST(Rope, LinearDividesEveryFrequency) {
  std::vector<double> plain = rope_inv_freq(16, 1e4, {}, 64);
  std::vector<double> f = rope_inv_freq(16, 1e4, linear(4), 64);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_DOUBLE_EQ(f[i], plain[i] / 4) << i;
  EXPECT_EQ(rope_attention_factor(linear(4)), 1.0);
}

TEST(Rope, YarnRampAndAttentionFactor) {
  const int64_t D = 16;
  const double theta = 100;
  // Over 16 original positions the pairs turning 32 down to 1 times are
  // i = 16 ln(16 / (2 pi r)) / (2 ln 100): -4.4 (r = 32) and 1.6 (r = 1),
  // truncated to [0, 2]: pair 0 keeps its frequency, pair 1 is half way,
  // pairs 2.. are divided by the factor.
  RopeScaling s = yarn(4, 16);
  std::vector<double> plain = rope_inv_freq(D, theta, {}, 64), f = rope_inv_freq(D, theta, s, 64);
  EXPECT_DOUBLE_EQ(f[0], plain[0]);
  EXPECT_DOUBLE_EQ(f[1], 0.5 * plain[1] / 4 + 0.5 * plain[1]);
  for (size_t i = 2; i < f.size(); ++i) EXPECT_DOUBLE_EQ(f[i], plain[i] / 4) << i;
  // An unset original context is max_seq_len's.
  EXPECT_EQ(rope_inv_freq(D, theta, yarn(4, 0), 16), f);
  EXPECT_NE(rope_inv_freq(D, theta, yarn(4, 0), 64), f);
  // beta_fast / beta_slow move the ramp: r = 2 .. 0.5 gives [floor(0.4), ceil(2.9)] = [0, 3].
  s.beta_fast = 2;
  s.beta_slow = 0.5;
  std::vector<double> g = rope_inv_freq(D, theta, s, 64);
  for (size_t i = 0; i < 4; ++i) {
    const double ramp = double(i) / 3;
    EXPECT_DOUBLE_EQ(g[i], plain[i] / 4 * ramp + plain[i] * (1 - ramp)) << i;
  }

  // Attention factor: 0.1 ln(factor) + 1 by default, 1 for factors up to 1,
  // the given one, or DeepSeek's mscale ratio.
  s = yarn(4, 16);
  EXPECT_DOUBLE_EQ(rope_attention_factor(s), 0.1 * std::log(4.0) + 1);
  EXPECT_EQ(rope_attention_factor(yarn(1, 16)), 1.0);
  s.attention_factor = 1.25;
  EXPECT_EQ(rope_attention_factor(s), 1.25);
  s.attention_factor = 0;
  s.mscale = 1;
  s.mscale_all_dim = 0.5;
  EXPECT_DOUBLE_EQ(rope_attention_factor(s),
                   (0.1 * std::log(4.0) + 1) / (0.05 * std::log(4.0) + 1));
  // The table carries the factor on cos and sin.
  s = yarn(4, 16);
  std::vector<float> t = host(rope_table(8, D, theta, s, 64));
  const double m = rope_attention_factor(s);
  f = rope_inv_freq(D, theta, s, 64);
  for (int64_t pos : {0, 5, 7})
    for (int64_t i = 0; i < D / 2; ++i) {
      EXPECT_EQ(t[size_t(pos * D + i)], float(std::cos(double(pos) * f[size_t(i)]) * m));
      EXPECT_EQ(t[size_t(pos * D + D / 2 + i)], float(std::sin(double(pos) * f[size_t(i)]) * m));
    }
}

TEST(Rope, ValidateNamesTheKey) {
  auto err = [](RopeScaling s) { return error_of([&] { s.validate("model.rope_scaling."); }); };
  RopeScaling s = linear(0);
  EXPECT_TRUE(contains(err(s), "model.rope_scaling.factor: must be a positive number")) << err(s);
  s = llama3(8, 1, 4, 0);
  EXPECT_TRUE(contains(err(s), "model.rope_scaling.original_max_seq_len:")) << err(s);
  s = llama3(8, 4, 1, 8192);
  EXPECT_TRUE(contains(err(s), "model.rope_scaling.high_freq_factor: must exceed")) << err(s);
  s = linear(2);
  s.low_freq_factor = 1;
  EXPECT_TRUE(contains(err(s), "model.rope_scaling.low_freq_factor: only llama3")) << err(s);
  s = yarn(4, 0);
  s.beta_slow = -1;
  EXPECT_TRUE(contains(err(s), "model.rope_scaling.beta_slow:")) << err(s);
  s = RopeScaling{};
  s.factor = 2;
  EXPECT_TRUE(contains(err(s), "model.rope_scaling.factor: only linear, llama3, yarn or longrope"))
      << err(s);
  EXPECT_EQ(err(yarn(4, 0)), "(no error)");
  EXPECT_EQ(err(llama3(8, 1, 4, 8192)), "(no error)");

  // Learned positions have nothing to scale.
  ModelConfig c = test::tiny_config(false, 50, 32);
  c.rope_scaling = linear(2);
  EXPECT_TRUE(contains(error_of([&] { c.validate(); }), "model.rope_scaling.type: gpt2"));
}

ModelConfig from_overrides(const std::vector<std::string>& o) {
  return model_config_from(Config::load(model_schema(), "", o));
}

TEST(Rope, ModelKeys) {
  ModelConfig c = from_overrides(
      {"model.preset=llama-tiny", "model.rope_scaling.type=llama3", "model.rope_scaling.factor=8",
       "model.rope_scaling.low_freq_factor=1", "model.rope_scaling.high_freq_factor=4",
       "model.rope_scaling.original_max_seq_len=64"});
  EXPECT_EQ(c.rope_scaling, llama3(8, 1, 4, 64));
  c = from_overrides({"model.preset=qwen2-tiny", "model.rope_scaling.type=yarn",
                      "model.rope_scaling.factor=4", "model.rope_scaling.beta_fast=16"});
  RopeScaling y = yarn(4, 0);
  y.beta_fast = 16;
  EXPECT_EQ(c.rope_scaling, y);
  EXPECT_FALSE(from_overrides({"model.preset=llama-tiny"}).rope_scaling.enabled());

  auto err = [](const std::vector<std::string>& o) { return error_of([&] { from_overrides(o); }); };
  std::string e = err({"model.preset=llama-tiny", "model.rope_scaling.type=linear"});
  EXPECT_TRUE(contains(e, "model.rope_scaling.factor: linear scaling needs a factor")) << e;
  e = err({"model.preset=llama-tiny", "model.rope_scaling.type=ntk"});
  EXPECT_TRUE(contains(e, "model.rope_scaling.type") && contains(e, "'ntk'")) << e;
  e = err(
      {"model.preset=llama-tiny", "model.rope_scaling.type=llama3", "model.rope_scaling.factor=8"});
  EXPECT_TRUE(contains(e, "model.rope_scaling.low_freq_factor")) << e;
  e = err({"model.preset=llama-tiny", "model.rope_scaling.factor=8"});  // no type
  EXPECT_TRUE(contains(e, "model.rope_scaling.factor: only")) << e;
  e = err(
      {"model.preset=gpt-tiny", "model.rope_scaling.type=linear", "model.rope_scaling.factor=2"});
  EXPECT_TRUE(contains(e, "model.rope_scaling.type: gpt2")) << e;
}

// ---- the KV cache of scaled models ----

std::vector<float> full_logits(Transformer& m, const std::vector<int32_t>& toks) {
  const int64_t T = int64_t(toks.size()), V = m.config().vocab_size;
  Activations a(m.config(), DType::F32, 1, T, false);
  Tensor t = Tensor::empty({1, T}, DType::I32), lg = Tensor::empty({T, V}, DType::F32);
  ops::copy_bytes_from_host(t, toks.data());
  m.forward_all_logits(a, t, lg);
  return host(lg);
}

// Prefill `prompt` tokens, then decode the rest one token per call.
std::vector<float> cached_logits(Transformer& m, const std::vector<int32_t>& toks, int64_t prompt) {
  const int64_t V = m.config().vocab_size, T = int64_t(toks.size());
  KVCache cache(m.config(), DType::F32, 1, m.config().max_seq_len, 64);
  std::vector<float> out;
  for (int64_t done = 0; done < T;) {
    const int64_t n = done == 0 ? prompt : 1;
    std::vector<int32_t> tok, slot, pos, rows;
    for (int64_t k = 0; k < n; ++k) {
      rows.push_back(int32_t(k));
      tok.push_back(toks[size_t(done + k)]);
      slot.push_back(0);
      pos.push_back(int32_t(done + k));
    }
    Tensor lg = Tensor::empty({n, V}, DType::F32);
    const std::vector<int32_t> table{0};
    m.forward_cached(cache, CachedStep{tok, slot, pos, rows, table}, lg);
    std::vector<float> h = host(lg);
    out.insert(out.end(), h.begin(), h.end());
    done += n;
  }
  return out;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

// Tolerance as kv_cache_test.cc's f32 one: the two paths differ only in
// summation order (measured ~1e-6).
TEST(Rope, ScaledKvCacheEqualsFullRecompute) {
  struct Case {
    const char* name;
    const char* arch;
    RopeScaling s;
  };
  for (const Case& k :
       {Case{"llama llama3", "llama", llama3(8, 1, 4, 32)},
        Case{"llama linear", "llama", linear(2)}, Case{"llama yarn", "llama", yarn(4, 16)},
        Case{"qwen2 yarn", "qwen2", yarn(4, 16)}}) {
    ModelConfig c = test::tiny_config(true, 50, 64);
    c.arch = k.arch;
    c.rope_theta = 100;  // head size 8: wavelengths 6.3, 20, 63, 199 positions
    Transformer plain(c, DType::F32, 5);
    c.rope_scaling = k.s;
    Transformer m(c, DType::F32, 5);
    std::vector<int32_t> toks;
    for (int i = 0; i < 40; ++i) toks.push_back(int32_t((i * 7 + 3) % 50));
    std::vector<float> full = full_logits(m, toks);
    double d = max_diff(cached_logits(m, toks, 9), full);
    double moved = max_diff(full_logits(plain, toks), full);
    std::printf("[%s] max |cached - full| %.3g; max |scaled - unscaled| %.3g\n", k.name, d, moved);
    EXPECT_LE(d, 2e-5) << k.name;
    EXPECT_GT(moved, 0.05) << k.name << ": the scaling does not reach these positions";
  }
}

// Partial rotary (ModelConfig::partial_rotary_factor): the cached decode
// turns the same first values of each q and k head as the full forward
// (tolerance as above), and the factor changes the logits (it reaches the
// model); GLM-4.5's preset (half of heads of 32, q/k norms, biases, MoE) and
// Phi-3 at Phi-4-mini's 0.75 and at 0.5.
TEST(Rope, PartialRotaryKvCacheEqualsFullRecompute) {
  struct Case {
    const char* name;
    const char* preset;
    double factor;
  };
  for (const Case& k : {Case{"glm4_moe 0.5", "glm4_moe-tiny", 0.5},
                        Case{"phi3 0.75", "phi3-tiny", 0.75}, Case{"phi3 0.5", "phi3-tiny", 0.5}}) {
    ModelConfig c = model_preset(k.preset);
    c.vocab_size = 50;
    c.max_seq_len = 64;
    c.sliding_window = 0;
    c.rope_theta = 100;
    c.init_std = 0.2;
    c.partial_rotary_factor = 1.0;
    Transformer whole(c, DType::F32, 5);
    c.partial_rotary_factor = k.factor;
    Transformer m(c, DType::F32, 5);
    EXPECT_EQ(c.rotary_dim(), int64_t(double(c.head_dim()) * k.factor)) << k.name;
    std::vector<int32_t> toks;
    for (int i = 0; i < 40; ++i) toks.push_back(int32_t((i * 7 + 3) % 50));
    std::vector<float> full = full_logits(m, toks);
    double d = max_diff(cached_logits(m, toks, 9), full);
    double moved = max_diff(full_logits(whole, toks), full);
    std::printf("[%s] max |cached - full| %.3g; max |partial - whole| %.3g\n", k.name, d, moved);
    EXPECT_LE(d, 2e-5) << k.name;
    EXPECT_GT(moved, 0.05) << k.name << ": the partial rotation does not reach the logits";
  }
}

TEST(Rope, PartialRotaryFactorIsCheckedNamingTheKey) {
  ModelConfig c = model_preset("glm4_moe-tiny");
  for (double bad : {0.0, 1.5, -0.5, 0.01}) {  // 0.01 x 32 rounds to no rotated pair
    c.partial_rotary_factor = bad;
    EXPECT_TRUE(contains(error_of([&] { c.validate(); }), "model.partial_rotary_factor")) << bad;
  }
  ModelConfig l = model_preset("llama-tiny");
  l.partial_rotary_factor = 0.5;
  const std::string err = error_of([&] { l.validate(); });
  EXPECT_TRUE(contains(err, "model.partial_rotary_factor")) << err;
  EXPECT_TRUE(contains(err, "glm4_moe")) << err;
}

}  // namespace
}  // namespace nk
