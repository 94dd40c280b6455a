// Transformer::forward_cached (prefill, then decode token by token over the
// KV cache) gives the logits of forward_all_logits on the whole sequence at
// every position, for a GPT-2-style model (learned positions) and a
// Llama-style one (RoPE, grouped-query attention), alone and with two
// sequences of different lengths sharing each call (ragged, no padding).
//
// Tolerances, as max |cached - full| over all logits:
//  - f32: 2e-5 absolute (logits are O(1); the two paths differ only in
//    summation order: the flash-tiled causal kernel vs the cache kernel, and
//    matrix products over different row counts). Measured: ~1e-6.
//  - bf16: 0.05 absolute. Both paths round activations to bf16 at the same
//    points; a 1-ulp flip (2^-8 relative) of one rounded value would
//    propagate through two layers. Measured: 0 (the ~1e-7 relative fp32
//    differences are absorbed by the bf16 roundings).
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "model/kv_cache.h"
#include "model/transformer.h"

#include "model/full_logits.h"
#include "model/tiny_config.h"
#include "test_util.h"

namespace nk {
namespace {

ModelConfig tiny(bool llama) {
  return test::tiny_config(llama, 50, 32);
}

std::vector<int32_t> random_tokens(int64_t n, uint64_t seed, int64_t V) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng.next_u64() % uint64_t(V));
  return t;
}

// Runs the sequences together: call 0 prefills prompt[i] tokens of each, then
// every later call decodes one token of every sequence that still has one.
// Returns each sequence's logits [T_i * V] at every position.
// kv: the cache's dtype (nullopt: the compute dtype).
std::vector<std::vector<float>> cached_logits(Transformer& m,
                                              const std::vector<std::vector<int32_t>>& seqs,
                                              const std::vector<int64_t>& prompt,
                                              KvDType kv = std::nullopt) {
  const int64_t V = m.config().vocab_size;
  KVCache cache(m.config(), m.compute_dtype(), 3, m.config().max_seq_len, 64, kHost, kv);
  std::vector<std::vector<float>> out(seqs.size());
  std::vector<int64_t> done(seqs.size(), 0);
  for (bool first = true;; first = false) {
    std::vector<int32_t> tok, slot, pos, rows;
    std::vector<size_t> owner;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int64_t n = first ? prompt[s] : std::min<int64_t>(1, int64_t(seqs[s].size()) - done[s]);
      for (int64_t k = 0; k < n; ++k) {
        rows.push_back(int32_t(tok.size()));
        owner.push_back(s);
        tok.push_back(seqs[s][size_t(done[s] + k)]);
        slot.push_back(int32_t(2 - s));  // slots need not follow the order
        pos.push_back(int32_t(done[s] + k));
      }
      done[s] += n;
    }
    if (tok.empty()) break;
    Tensor lg = Tensor::empty({int64_t(rows.size()), V}, DType::F32);
    const std::vector<int32_t> table{0, 1, 2};  // contiguous: one block per slot
    m.forward_cached(cache, CachedStep{tok, slot, pos, rows, table}, lg);
    std::vector<float> h(size_t(lg.numel()));
    ops::copy_to_host(lg, h.data());
    for (size_t r = 0; r < rows.size(); ++r)
      out[owner[r]].insert(out[owner[r]].end(), h.begin() + int64_t(r) * V,
                           h.begin() + int64_t(r + 1) * V);
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

void check(bool llama, DType dt, double tol) {
  Transformer m(tiny(llama), dt, 11);
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> a = random_tokens(23, 1, V), b = random_tokens(14, 2, V);
  std::vector<float> fa = test::full_logits(m, a), fb = test::full_logits(m, b);
  // Alone: prefill 7, then 16 decode steps.
  double alone = max_diff(cached_logits(m, {a}, {7})[0], fa);
  // Together: prefills of 9 and 3 in one call, then decoding side by side
  // (b finishes first; a goes on alone).
  auto both = cached_logits(m, {a, b}, {9, 3});
  double ta = max_diff(both[0], fa), tb = max_diff(both[1], fb);
  const double spread = test::logit_spread(fa);
  EXPECT_GT(spread, 0.1) << "logits vary";
  EXPECT_LE(alone, tol);
  EXPECT_LE(ta, tol);
  EXPECT_LE(tb, tol);
  std::printf("[%s %s] max |cached - full|: alone %.3g, batched %.3g / %.3g (logit spread %.3g)\n",
              llama ? "llama" : "gpt2", dtype_name(dt), alone, ta, tb, spread);
}

TEST(KvCacheModel, Gpt2F32) {
  check(false, DType::F32, 2e-5);
}
TEST(KvCacheModel, LlamaGqaF32) {
  check(true, DType::F32, 2e-5);
}
TEST(KvCacheModel, Gpt2Bf16) {
  check(false, DType::BF16, 0.05);
}
TEST(KvCacheModel, LlamaGqaBf16) {
  check(true, DType::BF16, 0.05);
}

// kv_cache_dtype: keys and values kept in bf16 or f16 under f32 compute
// (and f32 or f16 under bf16) give the logits of the compute dtype's cache
// within the cache rounding's effect, and bytes per position halve (or
// double). The bound: k and v rounded once (bf16 2^-9, f16 2^-11 relative)
// move scores and outputs by about that much of their O(1) size, amplified by
// this model's large weights (init 0.2: sharp attention) through two layers;
// 0.06 for bf16 and 0.01 for f16 absolute on logits of spread ~4.4 (measured:
// up to 0.028 and 0.0031, the printed line). A broken conversion (k read as
// raw bits, v unrounded into a narrower slot) is off by O(1).
void check_cache_dtype(bool llama, DType dt, DType kv, double tol) {
  Transformer m(tiny(llama), dt, 11);
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> a = random_tokens(23, 1, V), b = random_tokens(14, 2, V);
  auto same = cached_logits(m, {a, b}, {9, 3});
  auto got = cached_logits(m, {a, b}, {9, 3}, kv);
  const double da = max_diff(got[0], same[0]), db = max_diff(got[1], same[1]);
  EXPECT_LE(da, tol);
  EXPECT_LE(db, tol);
  if (dt == DType::F32 && kv != DType::F32) {
    EXPECT_GT(std::max(da, db), 0.0) << "the rounding of the cache shows";
  }
  const KVCache narrow(m.config(), dt, 3, 32, 8, kHost, kv), wide(m.config(), dt, 3, 32, 8);
  EXPECT_EQ(narrow.kv_dtype(), kv);
  EXPECT_EQ(narrow.cache_bytes() * int64_t(dtype_size(dt)),
            wide.cache_bytes() * int64_t(dtype_size(kv)));
  EXPECT_EQ(KVCache::token_bytes(m.config(), kv) * 32 * 3, narrow.cache_bytes());
  std::printf("[%s %s compute, %s cache] max |logits - %s cache's|: %.3g / %.3g\n",
              llama ? "llama" : "gpt2", dtype_name(dt), dtype_name(kv), dtype_name(dt), da, db);
}

TEST(KvCacheModel, Bf16CacheUnderF32) {
  check_cache_dtype(true, DType::F32, DType::BF16, 0.06);
  check_cache_dtype(false, DType::F32, DType::BF16, 0.06);
}
TEST(KvCacheModel, F16CacheUnderF32) {
  check_cache_dtype(true, DType::F32, DType::F16, 0.01);
  check_cache_dtype(false, DType::F32, DType::F16, 0.01);
}
TEST(KvCacheModel, OtherCacheUnderBf16) {
  check_cache_dtype(true, DType::BF16, DType::F32, 0.05);
  check_cache_dtype(true, DType::BF16, DType::F16, 0.05);
}

// A q8_0 cache (ggml's Q8_0 blocks: 32 values in 34 bytes) under f32 and
// bf16 compute: the f32 cache's logits within the quantisation's effect, on
// a model whose heads are 32 wide (one block a row). The bound: each value
// moves by up to half a step of its block's max / 127, for Gaussian values
// about 4x the RMS of bf16's rounding; a bf16 cache moves this model's
// logits by up to 1 % of their spread (0.12 of 12.6, sharp attention from
// the large init), so q8_0 by about 4 %: 5 % of the spread (measured: 2.6 %
// and 3.1 %, the printed line). A broken quantiser is off by O(spread). Bytes per
// position are 34/128 of f32's; a model whose rows are not whole blocks is
// refused naming the key.
TEST(KvCacheModel, Q8CacheUnderF32AndBf16) {
  for (bool llama : {true, false})
    for (DType dt : {DType::F32, DType::BF16}) {
      ModelConfig c = tiny(llama);
      c.d_model = 128;  // 4 heads of 32
      Transformer m(c, dt, 11);
      const int64_t V = c.vocab_size;
      std::vector<int32_t> a = random_tokens(23, 1, V), b = random_tokens(14, 2, V);
      auto same = cached_logits(m, {a, b}, {9, 3}, DType::F32);
      auto got = cached_logits(m, {a, b}, {9, 3}, DType::U8);
      const double da = max_diff(got[0], same[0]), db = max_diff(got[1], same[1]);
      const double spread = test::logit_spread(same[0]);
      EXPECT_LE(da, 0.05 * spread);
      EXPECT_LE(db, 0.05 * spread);
      EXPECT_GT(std::max(da, db), 0.0) << "the quantisation shows";
      const KVCache q8(c, dt, 3, 32, 8, kHost, DType::U8), f32(c, dt, 3, 32, 8, kHost, DType::F32);
      EXPECT_EQ(q8.cache_bytes() * 128, f32.cache_bytes() * 34);
      EXPECT_EQ(KVCache::token_bytes(c, DType::U8), 2 * 2 * c.n_kv_head * 34);
      EXPECT_TRUE(test::contains(q8.describe(), "KV cache q8_0 (compute")) << q8.describe();
      std::printf(
          "[%s %s compute, q8_0 cache] max |logits - f32 cache's|: %.3g / %.3g (spread %.3g)\n",
          llama ? "llama" : "gpt2", dtype_name(dt), da, db, spread);
    }
  // tiny(): heads of 8 values, not a whole block.
  check_kv_cache_dtype(tiny(true), DType::BF16, kHost, "generate.kv_cache_dtype");
  const std::string e = test::error_of(
      [] { check_kv_cache_dtype(tiny(true), DType::U8, kHost, "generate.kv_cache_dtype"); });
  EXPECT_TRUE(test::contains(e,
                             "generate.kv_cache_dtype: a q8_0 KV cache needs rows of a "
                             "multiple of 32 values; this model's head_dim is 8"))
      << e;
  EXPECT_TRUE(test::contains(
      test::error_of([] { KVCache(tiny(true), DType::F32, 1, 8, 4, kHost, DType::U8); }),
      "multiple of 32"));
}

TEST(KvCacheModel, CacheDtypeKey) {
  EXPECT_EQ(parse_kv_cache_dtype("auto", "generate.kv_cache_dtype"), std::nullopt);
  EXPECT_EQ(parse_kv_cache_dtype("bf16", "k"), DType::BF16);
  EXPECT_EQ(parse_kv_cache_dtype("float16", "k"), DType::F16);
  EXPECT_EQ(parse_kv_cache_dtype("f32", "k"), DType::F32);
  const std::string e = test::error_of([] { parse_kv_cache_dtype("fp8", "serve.kv_cache_dtype"); });
  EXPECT_NE(e.find("serve.kv_cache_dtype: 'fp8'"), std::string::npos) << e;
  EXPECT_NE(e.find("auto, f32, bf16, f16 or q8_0"), std::string::npos) << e;
  EXPECT_EQ(parse_kv_cache_dtype("q8_0", "k"), DType::U8);
  EXPECT_STREQ(kv_cache_dtype_name(DType::U8), "q8_0");
  EXPECT_STREQ(kv_cache_dtype_name(DType::BF16), "bf16");
}

TEST(KvCacheModel, CacheLongerThanTheModelIsAnError) {
  ModelConfig c = tiny(true);
  EXPECT_THROW(KVCache(c, DType::F32, 1, c.max_seq_len + 1, 8), Error);
}

}  // namespace
}  // namespace nk
