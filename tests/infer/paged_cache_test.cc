// The paged KV cache (infer/paged_cache.h) against the contiguous one:
//  - BlockPool: holders, free blocks before cached ones, least recently
//    released cached block reused first, a prefix found only with the same
//    tokens after the same parent.
//  - Logits at every position, prefill in chunks then decode, equal the
//    contiguous SlotCache's bit for bit (f32 and bf16, GPT-2 and Llama
//    shapes) for block sizes 1, 16 and 64, and the plain forward over the
//    whole sequence to 1e-5 relative (f32; the kv_cache_test tolerance: the
//    two paths differ in summation order only).
//  - A prefix shared through the cache (blocks held by two sequences, or kept
//    after the first closed) gives the same logits as computing it.
//  - Through the Generator: a repeated prompt is served from the prefix
//    cache with the same tokens; a pool too small for every request at once
//    preempts and recomputes, and every request still gets exactly the tokens
//    it gets alone; every block is given back at the end.
#include "infer/paged_cache.h"

#include <gtest/gtest.h>

#include "core/rng.h"
#include "infer/generate.h"
#include "tensor_util.h"
#include "test_util.h"

#include "model/full_logits.h"
#include "model/tiny_config.h"

namespace nk {
namespace {

std::vector<int32_t> random_tokens(int64_t n, uint64_t seed, int64_t V) {
  return test::random_id_list(n, V, seed);
}

TEST(BlockPool, HoldersFreeBlocksAndLeastRecentlyReleasedReuse) {
  BlockPool pool(4, 2);
  const std::vector<int32_t> a = {1, 2}, b = {3, 4};
  const int32_t x = pool.allocate(), y = pool.allocate();
  EXPECT_EQ(pool.used(), 2);
  const uint64_t ha = BlockPool::chain_hash(BlockPool::kRootHash, a);
  const uint64_t hb = BlockPool::chain_hash(ha, b);
  pool.register_full(x, ha, BlockPool::kRootHash, a);
  pool.register_full(y, hb, ha, b);
  EXPECT_EQ(pool.lookup(ha, BlockPool::kRootHash, a), x);  // a second holder
  EXPECT_EQ(pool.holders(x), 2);
  EXPECT_EQ(pool.lookup(hb, BlockPool::kRootHash, b), -1);  // right tokens, wrong parent
  pool.release(x);
  pool.release(x);
  pool.release(y);
  EXPECT_EQ(pool.used(), 0);
  EXPECT_EQ(pool.cached(), 2);
  EXPECT_EQ(pool.available(), 4);
  // The two never-registered blocks go first, then x (released before y).
  const int32_t f1 = pool.allocate(), f2 = pool.allocate();
  EXPECT_TRUE(f1 != x && f1 != y && f2 != x && f2 != y);
  EXPECT_EQ(pool.allocate(), x);
  EXPECT_EQ(pool.lookup(ha, BlockPool::kRootHash, a), -1);  // x's prefix is forgotten
  EXPECT_EQ(pool.lookup(hb, ha, b), y);                     // y is still cached
  EXPECT_EQ(pool.allocate(), -1);                           // all four held
}

// Runs `seqs` on `cache`: the first `prompt` tokens of each in chunks of at
// most `chunk` (all sequences' chunks in one step), then one token per
// sequence per step. Returns each sequence's logits at every position.
std::vector<std::vector<float>> run_all(Transformer& m, SequenceCache& cache,
                                        const std::vector<std::vector<int32_t>>& seqs,
                                        int64_t prompt, int64_t chunk) {
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> h;
  std::vector<int64_t> done(seqs.size(), 0);
  for (const auto& s : seqs) {
    const SequenceCache::Opened o =
        cache.open(int64_t(s.size()), std::span(s).subspan(0, size_t(prompt)));
    EXPECT_NE(o.handle, SequenceCache::kNoRoom);
    EXPECT_EQ(o.cached, 0);
    h.push_back(o.handle);
  }
  std::vector<std::vector<float>> out(seqs.size());
  while (true) {
    StepBuffer step;
    std::vector<size_t> owner;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t left = int64_t(seqs[i].size()) - done[i];
      const int64_t n = std::min(left, done[i] < prompt ? std::min(chunk, prompt - done[i]) : 1);
      if (n <= 0) continue;
      EXPECT_TRUE(cache.append(h[i], done[i],
                               std::span(seqs[i]).subspan(size_t(done[i]), size_t(n)), step));
      for (int64_t k = 0; k < n; ++k) {
        step.logit_rows.push_back(int32_t(step.tokens.size() - size_t(n - k)));
        owner.push_back(i);
      }
      done[i] += n;
    }
    if (step.tokens.empty()) break;
    Tensor lg = Tensor::empty({int64_t(owner.size()), V}, DType::F32);
    cache.forward(m, step, lg);
    const std::vector<float> got = test::host(lg);
    for (size_t r = 0; r < owner.size(); ++r)
      out[owner[r]].insert(out[owner[r]].end(), got.begin() + int64_t(r) * V,
                           got.begin() + int64_t(r + 1) * V);
  }
  for (int32_t x : h) cache.close(x);
  return out;
}

PagedCacheOptions options(int64_t block_size, int64_t blocks, int64_t max_len, int64_t max_seqs,
                          int64_t max_tokens) {
  PagedCacheOptions o;
  o.block_size = block_size;
  o.blocks = blocks;
  o.max_len = max_len;
  o.max_seqs = max_seqs;
  o.max_tokens = max_tokens;
  return o;
}

TEST(PagedCache, EveryPositionEqualsTheContiguousCache) {
  for (bool llama : {false, true})
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(llama ? "llama " : "gpt2 ") + dtype_name(dt));
      Transformer m(test::tiny_config(llama, 60, 128), dt, 3);
      const std::vector<std::vector<int32_t>> seqs = {
          random_tokens(100, 1, 60), random_tokens(37, 2, 60), random_tokens(70, 3, 60)};
      SlotCache slots(m.config(), dt, 3, 128, 64);
      const auto want = run_all(m, slots, seqs, 30, 20);
      for (int64_t B : {1, 16, 64}) {
        PagedCache paged(m.config(), dt, options(B, 2 * 128 / B + 3, 128, 3, 64));
        const auto got = run_all(m, paged, seqs, 30, 20);
        for (size_t i = 0; i < seqs.size(); ++i)
          EXPECT_EQ(got[i], want[i]) << "block size " << B << ", sequence " << i;
        EXPECT_EQ(paged.blocks_used(), 0);
      }
      if (dt == DType::F32) {
        for (size_t i = 0; i < seqs.size(); ++i)
          EXPECT_LE(test::rel_err(want[i], test::full_logits(m, seqs[i])), 1e-5) << i;
      }
    }
}

// Opens `ids` on cache and computes all but the part already cached; returns
// the logits of every computed position and the number cached.
std::pair<std::vector<float>, int64_t> prefill(Transformer& m, PagedCache& cache,
                                               const std::vector<int32_t>& ids, int32_t& handle) {
  const SequenceCache::Opened o = cache.open(int64_t(ids.size()), ids);
  EXPECT_NE(o.handle, SequenceCache::kNoRoom);
  handle = o.handle;
  StepBuffer step;
  EXPECT_TRUE(cache.append(o.handle, o.cached, std::span(ids).subspan(size_t(o.cached)), step));
  for (size_t r = 0; r < step.tokens.size(); ++r) step.logit_rows.push_back(int32_t(r));
  Tensor lg = Tensor::empty({int64_t(step.tokens.size()), m.config().vocab_size}, DType::F32);
  cache.forward(m, step, lg);
  return {test::host(lg), o.cached};
}

TEST(PagedCache, PrefixBlocksAreSharedAndKept) {
  Transformer m(test::tiny_config(true, 60, 128), DType::F32, 4);
  const int64_t V = 60;
  PagedCache cache(m.config(), DType::F32, options(16, 20, 128, 4, 128));
  const std::vector<int32_t> a = random_tokens(40, 5, V);
  std::vector<int32_t> b(a.begin(), a.begin() + 37);  // 2 full blocks shared, then its own
  const std::vector<int32_t> tail = random_tokens(9, 6, V);
  b.insert(b.end(), tail.begin(), tail.end());
  int32_t ha = 0, hb = 0, hc = 0;
  const auto [la, ca] = prefill(m, cache, a, ha);
  EXPECT_EQ(ca, 0);
  EXPECT_EQ(cache.blocks_used(), 3);
  const auto [lb, cb] = prefill(m, cache, b, hb);
  EXPECT_EQ(cb, 32);
  EXPECT_EQ(cache.blocks_of(hb)[0], cache.blocks_of(ha)[0]);
  EXPECT_EQ(cache.blocks_of(hb)[1], cache.blocks_of(ha)[1]);
  EXPECT_NE(cache.blocks_of(hb)[2], cache.blocks_of(ha)[2]);
  EXPECT_EQ(cache.blocks_used(), 3 + 1);  // b's 46 positions: a's 2 full blocks + 1 of its own
  const std::vector<float> fb = test::full_logits(m, b);
  EXPECT_LE(test::rel_err(lb, std::vector<float>(fb.begin() + 32 * V, fb.end())), 1e-5);
  cache.close(ha);
  cache.close(hb);
  EXPECT_EQ(cache.blocks_used(), 0);
  // a's 2 full blocks stay cached; the partial third blocks are free again.
  EXPECT_EQ(cache.pool().cached(), 2);
  EXPECT_EQ(cache.pool().available(), 20);
  // A prompt equal to a's whole: its first two blocks come from the cache
  // (the last token is always computed, so not all 40).
  const auto [lc, cc] = prefill(m, cache, a, hc);
  EXPECT_EQ(cc, 32);
  EXPECT_LE(test::rel_err(lc, std::vector<float>(la.begin() + 32 * V, la.end())), 1e-5);
  cache.close(hc);
}

TEST(PagedCache, PreemptionRecomputesAndEveryRequestGetsItsTokens) {
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled" : "greedy");
    Transformer m(test::tiny_config(true, 60, 128), DType::F32, 9);
    std::vector<GenerationRequest> reqs;
    for (int64_t i = 0; i < 6; ++i) {
      GenerationRequest r;
      r.prompt = random_tokens(5 + 7 * i, 40 + uint64_t(i), 60);
      r.max_new_tokens = 30;
      r.sampling.temperature = sampled ? 1.0 : 0.0;
      r.sampling.seed = uint64_t(i);
      reqs.push_back(r);
    }
    std::vector<std::vector<int32_t>> want;
    for (const GenerationRequest& r : reqs) {
      Generator one(m, nullptr, 1);
      want.push_back(one.run({r})[0].tokens);
    }
    // 12 blocks of 8 = 96 positions for six sequences of up to 35 + 29.
    auto cache = std::make_unique<PagedCache>(m.config(), DType::F32, options(8, 12, 128, 6, 40));
    PagedCache* pc = cache.get();
    Generator gen(m, nullptr, std::move(cache), 6);
    const auto got = gen.run(reqs);
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, want[i]) << i;
    EXPECT_GT(gen.preemptions(), 0);
    EXPECT_EQ(pc->blocks_used(), 0);
  }
}

// Through the Generator: a request repeating an earlier one's prompt takes
// its full blocks from the prefix cache and gets the same tokens.
TEST(PagedCache, GeneratorCountsPrefixHitsAndKeepsTokens) {
  Transformer m(test::tiny_config(false, 60, 128), DType::F32, 5);
  GenerationRequest r;
  r.prompt = random_tokens(40, 8, 60);
  r.max_new_tokens = 10;
  r.sampling.temperature = 0;
  Generator gen(m, nullptr,
                std::make_unique<PagedCache>(m.config(), DType::F32, options(16, 20, 128, 2, 64)),
                2);
  const std::vector<int32_t> first = gen.run({r})[0].tokens;
  EXPECT_EQ(gen.prefix_hit_tokens(), 0);
  EXPECT_EQ(gen.run({r})[0].tokens, first);
  EXPECT_EQ(gen.prefix_hit_tokens(), 32);  // 2 full blocks of the 40-token prompt
  Generator plain(m, nullptr, 1);
  EXPECT_EQ(plain.run({r})[0].tokens, first);
}

}  // namespace
}  // namespace nk
