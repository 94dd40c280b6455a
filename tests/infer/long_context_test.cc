// Contexts past 32k positions on CPU (issue 40, item 4): a tiny Llama-shaped
// model with YaRN scaling (factor 4 over an original context of 16384,
// max_seq_len 65536) takes a prompt of 32800 tokens and decodes.
//  - generate's path (Generator over the contiguous cache it sizes itself, f32
//    keys and values): the logits of every sampled step, at positions 32799..
//    32806, equal the model's own full-sequence forward (no cache) over the
//    prompt and the generated tokens;
//  - serve's path (PagedCache, blocks of 16, prefix caching on) with the keys
//    and values in bf16 and in f16 (kv_cache_dtype): the same positions'
//    logits against the f32 cache's.
// Nothing caps a context at 32768 positions: the prompt alone is past it.
//
// Tolerances, as max |a - b| over the logits (spread > 1; printed):
//  - f32 cache vs full forward: 1e-4. Summation orders differ (the flash-tiled
//    causal kernel against the cache kernel's two-pass softmax over 32k
//    scores); measured ~1e-6.
//  - bf16 cache: 0.02, f16 cache: 0.005. Keys and values rounded once
//    (2^-9, 2^-11 relative) move scores and outputs by about that fraction of
//    their O(1) size; a softmax over 32k positions averages the rounding
//    rather than adding it up.
// One layer and heads of 16 keep the four quadratic passes to seconds each.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/rng.h"
#include "infer/generate.h"
#include "infer/paged_cache.h"
#include "model/full_logits.h"
#include "model/tiny_config.h"

namespace nk {
namespace {

constexpr int64_t kPrompt = 32800, kNew = 8, kChunk = 4096;

ModelConfig long_config() {
  ModelConfig c = test::tiny_config(true, 64, 65536);
  c.n_layer = 1;
  c.n_head = 2;
  c.n_kv_head = 1;
  c.rope_scaling.type = RopeScalingType::Yarn;
  c.rope_scaling.factor = 4;
  c.rope_scaling.original_max_seq_len = 16384;
  return c;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

// The logits at positions P-1 .. T-1 of seq (T = seq.size()) through serve's
// paged cache in dtype kv: the prompt seq[0..P) in chunks of kChunk, then one
// token a step.
std::vector<float> paged_logits(Transformer& m, const std::vector<int32_t>& seq, int64_t P,
                                KvDType kv) {
  const int64_t T = int64_t(seq.size()), V = m.config().vocab_size, B = 16;
  PagedCacheOptions o;
  o.block_size = B;
  o.max_len = T;
  o.max_seqs = 1;
  o.max_tokens = kChunk;
  o.blocks = (T + B - 1) / B;
  o.kv_dtype = kv;
  PagedCache cache(m.config(), m.compute_dtype(), o);
  EXPECT_EQ(cache.kv().kv_dtype(), kv.value_or(m.compute_dtype()));
  const std::span<const int32_t> all(seq);
  const SequenceCache::Opened op = cache.open(T, all.first(size_t(P)));
  EXPECT_NE(op.handle, SequenceCache::kNoRoom);
  StepBuffer step;
  Tensor lg = Tensor::empty({1, V}, DType::F32);
  std::vector<float> out, row(static_cast<size_t>(V));
  for (int64_t first = 0; first < T;) {
    const int64_t n = first < P ? std::min(kChunk, P - first) : 1;
    step.clear();
    EXPECT_TRUE(cache.append(op.handle, first, all.subspan(size_t(first), size_t(n)), step));
    step.logit_rows = {int32_t(n - 1)};
    cache.forward(m, step, lg);
    first += n;
    if (first < P) continue;
    ops::copy_to_host(lg, row.data());
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

TEST(LongContext, YarnPast32kThroughGenerateAndServeCaches) {
  Transformer m(long_config(), DType::F32, 5);
  const int64_t V = m.config().vocab_size;
  ASSERT_GT(kPrompt, 32768);
  ASSERT_GT(m.config().max_seq_len, kPrompt + kNew);
  Rng rng(3);
  GenerationRequest r;
  for (int64_t i = 0; i < kPrompt; ++i) r.prompt.push_back(int32_t(rng.below(uint64_t(V))));
  r.max_new_tokens = kNew;
  r.sampling.temperature = 0;
  // generate's engine: greedy steps over the cache it sizes (f32, auto).
  std::vector<float> gen_logits;
  Generator gen(m, nullptr, 1, kChunk);
  const std::vector<GenerationResult> res =
      gen.run({r}, {}, [&](int64_t, const float* lg, int64_t n) {
        gen_logits.insert(gen_logits.end(), lg, lg + n);
      });
  ASSERT_EQ(int64_t(res[0].tokens.size()), kNew);
  ASSERT_EQ(int64_t(gen_logits.size()), kNew * V);
  EXPECT_GE(gen.cache()->max_len(), kPrompt + kNew - 1);

  // The sequence the steps saw: the prompt and every generated token but the last.
  std::vector<int32_t> seq = r.prompt;
  seq.insert(seq.end(), res[0].tokens.begin(), res[0].tokens.end() - 1);
  const int64_t T = int64_t(seq.size());
  const std::vector<float> full = test::full_logits(m, seq);
  const std::vector<float> full_tail(full.begin() + (kPrompt - 1) * V, full.end());
  const double spread = test::logit_spread(full_tail);
  EXPECT_GT(spread, 1.0) << "logits vary";
  const double d32 = max_diff(gen_logits, full_tail);
  EXPECT_LE(d32, 1e-4);
  std::printf("[positions %lld..%lld] f32 cache (generate) vs full forward: %.3g (spread %.3g)\n",
              (long long)(kPrompt - 1), (long long)(T - 1), d32, spread);

  for (auto [kv, tol] : {std::pair{DType::BF16, 0.02}, std::pair{DType::F16, 0.005}}) {
    const double d = max_diff(paged_logits(m, seq, kPrompt, kv), gen_logits);
    EXPECT_LE(d, tol) << dtype_name(kv);
    EXPECT_GT(d, 0.0) << dtype_name(kv) << ": the rounding of the cache shows";
    std::printf("[positions %lld..%lld] %s paged cache (serve) vs f32 cache: %.3g\n",
                (long long)(kPrompt - 1), (long long)(T - 1), dtype_name(kv), d);
  }
}

}  // namespace
}  // namespace nk
