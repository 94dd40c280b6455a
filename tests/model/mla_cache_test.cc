// The latent KV cache of Multi-head Latent Attention (DeepSeek-V2/V3;
// nn::LatentAttention::cached_forward): per position and layer it keeps
// kv_lora_rank + qk_rope_head_dim values (the normed latent and the shared
// rotary key), and decode absorbs kv_b into the queries and the outputs.
// Checked against the plain forward (which expands every head's key and
// value): cached logits at every position, alone and with sequences sharing
// calls; greedy generation; a paged cache under continuous batching; caches
// in bf16 and f16; a block-quantised kv_b; and the cache's size.
//
// Tolerances, as max |cached - full| over all logits (spread ~1-3):
//  - f32: 1e-4 absolute. The paths differ in summation order (the score
//    q . (W_uk c) against (W_uk^T q) . c, the output W_uv (sum p c) against
//    sum p (W_uv c), the flash-tiled kernel against the cache's) and in the
//    MoE products' row counts.
//  - bf16 compute: 0.1 absolute, every token routed to every expert (see
//    mla_check_cached): the absorbed query and the weighted latent are
//    rounded to bf16 where the plain path rounds the expanded keys and
//    values: different roundings of 2^-9 relative through three layers.
//  - a bf16 / f16 cache under f32: 0.06 / 0.01 of the f32 cache's logits
//    (one rounding of each stored value, as tests/model/kv_cache_test.cc).
// The measured values are printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/parallel.h"
#include "core/rng.h"
#include "infer/generate.h"
#include "infer/paged_cache.h"
#include "model/kv_cache.h"
#include "model/transformer.h"

#include "model/full_logits.h"
#include "test_util.h"

namespace nk {
namespace {

ModelConfig mla_tiny(const char* preset) {
  ModelConfig c = model_preset(preset);
  c.init_std = 0.1;  // attention far from uniform, experts' scores far apart
  return c;
}

std::vector<int32_t> mla_tokens(int64_t n, uint64_t seed, int64_t V) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng.below(uint64_t(V)));
  return t;
}

double mla_max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

// Call 0 prefills prompt[i] tokens of each sequence, every later call
// decodes one token of each that has one left; a contiguous cache of 3
// slots. Each sequence's logits [T_i V] at every position.
std::vector<std::vector<float>> mla_cached_logits(Transformer& m,
                                                  const std::vector<std::vector<int32_t>>& seqs,
                                                  const std::vector<int64_t>& prompt,
                                                  KvDType kv = std::nullopt) {
  const int64_t V = m.config().vocab_size;
  KVCache cache(m.config(), m.compute_dtype(), 3, 64, 64, kHost, kv);
  EXPECT_TRUE(cache.latent());
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
        slot.push_back(int32_t(2 - s));
        pos.push_back(int32_t(done[s] + k));
      }
      done[s] += n;
    }
    if (tok.empty()) break;
    Tensor lg = Tensor::empty({int64_t(rows.size()), V}, DType::F32);
    const std::vector<int32_t> table{0, 1, 2};
    m.forward_cached(cache, CachedStep{tok, slot, pos, rows, table}, lg);
    std::vector<float> h(size_t(lg.numel()));
    ops::copy_to_host(lg, h.data());
    for (size_t r = 0; r < rows.size(); ++r)
      out[owner[r]].insert(out[owner[r]].end(), h.begin() + int64_t(r) * V,
                           h.begin() + int64_t(r + 1) * V);
  }
  return out;
}

// all_experts: every token to every expert (and every group), so that no
// routing choice can flip between the paths (bf16: a near-tie of two
// experts' scores, moved by one rounding, changes a logit by O(1); measured
// 1.04 at one position of deepseek_v3-tiny with its top-2).
void mla_check_cached(const char* preset, DType dt, double tol, bool all_experts = false) {
  ModelConfig c = mla_tiny(preset);
  if (all_experts) {
    c.num_experts_per_tok = c.num_experts;
    c.moe_topk_group = c.moe_n_group;
  }
  Transformer m(c, dt, 11);
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> a = mla_tokens(23, 1, V), b = mla_tokens(14, 2, V);
  std::vector<float> fa = test::full_logits(m, a), fb = test::full_logits(m, b);
  const double alone = mla_max_diff(mla_cached_logits(m, {a}, {7})[0], fa);
  auto both = mla_cached_logits(m, {a, b}, {9, 3});
  const double ta = mla_max_diff(both[0], fa), tb = mla_max_diff(both[1], fb);
  const double spread = test::logit_spread(fa);
  EXPECT_GT(spread, 0.1) << "logits vary";
  EXPECT_LE(alone, tol);
  EXPECT_LE(ta, tol);
  EXPECT_LE(tb, tol);
  std::printf("[%s %s] max |latent cached - full|: alone %.3g, batched %.3g / %.3g (spread %.3g)\n",
              preset, dtype_name(dt), alone, ta, tb, spread);
}

TEST(MlaCache, CachedEqualsFullF32) {
  mla_check_cached("deepseek_v2-tiny", DType::F32, 1e-4);
  mla_check_cached("deepseek_v3-tiny", DType::F32, 1e-4);
}

TEST(MlaCache, CachedEqualsFullBf16) {
  mla_check_cached("deepseek_v2-tiny", DType::BF16, 0.1, true);
  mla_check_cached("deepseek_v3-tiny", DType::BF16, 0.1, true);
}

// A bf16 or f16 cache under f32 compute: the f32 cache's logits within the
// rounding's effect (and the rounding shows).
TEST(MlaCache, NarrowCacheDtypes) {
  for (auto [kv, tol] : {std::pair{DType::BF16, 0.06}, {DType::F16, 0.01}}) {
    Transformer m(mla_tiny("deepseek_v3-tiny"), DType::F32, 11);
    const int64_t V = m.config().vocab_size;
    std::vector<int32_t> a = mla_tokens(23, 1, V), b = mla_tokens(14, 2, V);
    auto same = mla_cached_logits(m, {a, b}, {9, 3});
    auto got = mla_cached_logits(m, {a, b}, {9, 3}, kv);
    const double da = mla_max_diff(got[0], same[0]), db = mla_max_diff(got[1], same[1]);
    EXPECT_LE(da, tol) << dtype_name(kv);
    EXPECT_LE(db, tol) << dtype_name(kv);
    EXPECT_GT(std::max(da, db), 0.0) << "the rounding of the cache shows";
    std::printf("[deepseek_v3-tiny f32, %s latent cache] max |logits - f32 cache's|: %.3g / %.3g\n",
                dtype_name(kv), da, db);
  }
}

// A q8_0 latent cache: rows of 56 + 8 = 64 values (two Q8_0 blocks), the
// f32 cache's logits within the quantisation's effect (5 % of their spread,
// as tests/model/kv_cache_test.cc argues); the tiny preset's rows of 40 values are
// refused naming the key. Every token goes to every expert (a near-tie of two
// experts' scores, moved by the quantisation, would change a logit by O(1):
// see mla_check_cached).
TEST(MlaCache, Q8LatentCache) {
  ModelConfig c = mla_tiny("deepseek_v3-tiny");
  c.kv_lora_rank = 56;
  c.num_experts_per_tok = c.num_experts;
  c.moe_topk_group = c.moe_n_group;
  Transformer m(c, DType::F32, 11);
  const int64_t V = c.vocab_size;
  std::vector<int32_t> a = mla_tokens(23, 1, V), b = mla_tokens(14, 2, V);
  auto same = mla_cached_logits(m, {a, b}, {9, 3});
  auto got = mla_cached_logits(m, {a, b}, {9, 3}, DType::U8);
  const double da = mla_max_diff(got[0], same[0]), db = mla_max_diff(got[1], same[1]);
  const double spread = test::logit_spread(same[0]);
  EXPECT_LE(da, 0.05 * spread);
  EXPECT_LE(db, 0.05 * spread);
  EXPECT_GT(std::max(da, db), 0.0) << "the quantisation shows";
  EXPECT_EQ(KVCache::token_bytes(c, DType::U8), 2 * 34 * c.n_layer);
  std::printf(
      "[deepseek_v3-tiny f32, q8_0 latent cache] max |logits - f32 cache's|: %.3g / %.3g (spread "
      "%.3g)\n",
      da, db, spread);
  const std::string e = test::error_of([] {
    check_kv_cache_dtype(model_preset("deepseek_v3-tiny"), DType::U8, kHost,
                         "serve.kv_cache_dtype");
  });
  EXPECT_TRUE(test::contains(e,
                             "serve.kv_cache_dtype: a q8_0 KV cache needs rows of a multiple "
                             "of 32 values; this model's latent row (kv_lora_rank + "
                             "qk_rope_head_dim) is 40"))
      << e;
}

// Bytes per position: (kv_lora_rank + qk_rope_head_dim) x layers x the
// dtype's bytes, where per-head keys and values took 2 x heads x head_dim x
// layers x bytes; the log line says both.
TEST(MlaCache, SizePerTokenIsTheLatentRow) {
  for (const char* preset : {"deepseek_v2-tiny", "deepseek_v3-tiny"}) {
    const ModelConfig c = model_preset(preset);
    for (DType kv : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::string(preset) + " " + dtype_name(kv));
      const int64_t per =
          (c.kv_lora_rank + c.qk_rope_head_dim) * c.n_layer * int64_t(dtype_size(kv));
      EXPECT_EQ(per, (32 + 8) * 3 * int64_t(dtype_size(kv)));
      EXPECT_EQ(KVCache::token_bytes(c, kv), per);
      const int64_t heads = 2 * c.n_head * c.head_dim() * c.n_layer * int64_t(dtype_size(kv));
      EXPECT_EQ(KVCache::head_token_bytes(c, kv), heads);
      const KVCache cache(c, DType::F32, 2, 40, 8, kHost, kv);
      EXPECT_TRUE(cache.latent());
      EXPECT_EQ(cache.cache_bytes(), per * 2 * 40);
      const std::string line = cache.describe();
      EXPECT_TRUE(test::contains(line, fmt::format("KV cache {} (compute f32): {} bytes/token "
                                                   "(latent rows of 40 values per layer; "
                                                   "per-head keys and values: {})",
                                                   dtype_name(kv), per, heads)))
          << line;
      // The paged pool sizes by the latent rows too; a tensor-parallel rank
      // holds them whole (its heads are split, its latent rows are not),
      // where a rank of a per-head cache holds 1/tp of the heads.
      EXPECT_EQ(PagedCache::blocks_for_memory(c, kv, 16, 1.0), (1 << 20) / (per * 16));
      EXPECT_EQ(PagedCache::blocks_for_memory(c, kv, 16, 1.0, 2), (1 << 20) / (per * 16));
      const ModelConfig d = model_preset("llama-tiny");  // 2 kv heads
      EXPECT_EQ(PagedCache::blocks_for_memory(d, kv, 16, 1.0, 2),
                (1 << 20) / (KVCache::block_bytes(d, kv, 16) / 2));
    }
  }
}

// The old engine: the whole context through forward_last_logits per token.
std::vector<int32_t> mla_greedy_by_recompute(Transformer& m, std::vector<int32_t> ctx, int64_t n) {
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> out;
  Tensor lg = Tensor::empty({1, V}, DType::F32);
  std::vector<float> h(static_cast<size_t>(V));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t T = int64_t(ctx.size());
    Activations a(m.config(), m.compute_dtype(), 1, T, false);
    Tensor t = Tensor::empty({1, T}, DType::I32);
    ops::copy_bytes_from_host(t, ctx.data());
    m.forward_last_logits(a, t, lg);
    ops::copy_to_host(lg, h.data());
    const int32_t next = int32_t(std::max_element(h.begin(), h.end()) - h.begin());
    ctx.push_back(next);
    out.push_back(next);
  }
  return out;
}

GenerationRequest mla_request(std::vector<int32_t> prompt, int64_t n, double temperature,
                              uint64_t seed) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = n;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  return r;
}

TEST(MlaCache, GreedyEqualsRecomputingTheContext) {
  for (const char* preset : {"deepseek_v2-tiny", "deepseek_v3-tiny"}) {
    Transformer m(mla_tiny(preset), DType::F32, 3);
    Generator gen(m, nullptr, 2);
    std::vector<int32_t> p = mla_tokens(9, 7, m.config().vocab_size);
    auto res = gen.run({mla_request(p, 20, 0, 0)});
    EXPECT_EQ(res[0].tokens, mla_greedy_by_recompute(m, p, 20)) << preset;
  }
}

// Five prompts through 2 sequences at a time over a paged cache of blocks
// of 4 positions (continuous batching, prefill chunks of 8 mixed with
// decode), sampled at temperature 1 with per-request seeds: each request's
// tokens and logits are those of it alone (f32: 2e-5, the products' row
// counts only).
TEST(MlaCache, PagedBatchEqualsEachRequestAlone) {
  Transformer m(mla_tiny("deepseek_v3-tiny"), DType::F32, 4);
  const int64_t V = m.config().vocab_size;
  std::vector<GenerationRequest> reqs;
  int64_t i = 0;
  for (int64_t n : {17, 1, 6, 11, 3}) {
    reqs.push_back(mla_request(mla_tokens(n, 100 + uint64_t(n), V), 6 + i, 1.0, uint64_t(40 + i)));
    ++i;
  }
  PagedCacheOptions o;
  o.block_size = 4;
  o.blocks = 24;
  o.max_len = 48;
  o.max_seqs = 2;
  o.max_tokens = 16;
  o.prefix_caching = false;
  std::vector<std::vector<float>> batched(reqs.size()), alone(reqs.size());
  Generator gen(m, nullptr, std::make_unique<PagedCache>(m.config(), DType::F32, o), 2);
  auto res = gen.run(reqs, {}, [&](int64_t s, const float* l, int64_t n) {
    batched[size_t(s)].insert(batched[size_t(s)].end(), l, l + n);
  });
  double worst = 0;
  for (size_t k = 0; k < reqs.size(); ++k) {
    Generator one(m, nullptr, 1);
    auto r1 = one.run({reqs[k]}, {}, [&](int64_t, const float* l, int64_t n) {
      alone[k].insert(alone[k].end(), l, l + n);
    });
    EXPECT_EQ(res[k].tokens, r1[0].tokens) << k;
    EXPECT_EQ(int64_t(res[k].tokens.size()), reqs[k].max_new_tokens);
    ASSERT_EQ(batched[k].size(), alone[k].size());
    worst = std::max(worst, mla_max_diff(batched[k], alone[k]));
  }
  EXPECT_LE(worst, 2e-5);
  std::printf("[deepseek_v3-tiny paged, blocks of 4] batched vs alone: max |logit diff| %.3g\n",
              worst);
}

// A single sequence's decode has one (token, latent head) pair per call,
// fewer than the threads: ops::attention_cached cuts its query heads into
// runs, one task each (ops/kv_attention_split.h). The cached logits at
// every position (a prefill of 7, then 16 single-token decodes) are the
// same with 2 and 4 threads as with one, bit for bit, f32 and bf16.
TEST(MlaCache, DecodeGivesTheSameLogitsOnAnyThreadCount) {
  const int saved = num_threads();
  for (const char* preset : {"deepseek_v2-tiny", "deepseek_v3-tiny"})
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(preset) + " " + dtype_name(dt));
      Transformer m(mla_tiny(preset), dt, 12);
      const std::vector<int32_t> a = mla_tokens(23, 4, m.config().vocab_size);
      set_num_threads(1);
      const std::vector<float> one = mla_cached_logits(m, {a}, {7})[0];
      for (int threads : {2, 4}) {
        set_num_threads(threads);
        const std::vector<float> got = mla_cached_logits(m, {a}, {7})[0];
        EXPECT_EQ(got, one) << threads << " threads: max |diff| " << mla_max_diff(got, one);
      }
    }
  set_num_threads(saved);
}

// A block-quantised model (W8A16: int8 weights, f32 activations, so the
// products are those of the dequantised weights): the decode dequantises
// kv_b once into the cache and gives the plain forward's logits.
TEST(MlaCache, QuantizedKvB) {
  const ModelConfig c = mla_tiny("deepseek_v2-tiny");
  Transformer src(c, DType::F32, 5);
  std::vector<std::string> all;
  for (const ParamInfo& p : src.layout().params()) all.push_back(p.name);
  Transformer q(c, DType::F32, 0, ParamInit::Zeros, all, kHost, FrozenWeights::Quantized,
                quant_plan_for(c, ops::QuantType::W8A16));
  for (const ParamInfo& p : q.layout().params())
    q.set_param(p, src.param_f32(src.layout().find(p.name)));
  ASSERT_TRUE(q.layout().find("h.0.attn.kv_b.weight").quantized);
  const std::vector<int32_t> a = mla_tokens(19, 3, c.vocab_size);
  const double d = mla_max_diff(mla_cached_logits(q, {a}, {5})[0], test::full_logits(q, a));
  EXPECT_LE(d, 1e-4);
  std::printf("[deepseek_v2-tiny w8a16] max |latent cached - full|: %.3g\n", d);
}

}  // namespace
}  // namespace nk
