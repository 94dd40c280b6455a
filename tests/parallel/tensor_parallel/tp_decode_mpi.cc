// The cached decode under tensor parallelism (Transformer::forward_cached
// over a cache of this rank's heads) against one process: a whole model and
// its TP2 split from the same seed (each rank's shards the whole one's
// slices) generate the same requests through the batched Generator (five
// prompts of 1..17 tokens, two sequences at a time, prefill chunks of 8,
// sampled at temperature 1 with a seed each; over the contiguous cache and
// the paged one). Same tokens, logits within 2e-5 (f32; only the order of
// the row-parallel layers' additions differs). The families cover what the
// decode's split touches: GPT-2 (learned positions added by rank 0, biases,
// a vocabulary of 257 whose padding the gather drops: the second rank
// scores one real id), Llama (grouped-query, an untied head), Qwen3
// (per-head q/k norms, a tied head), Qwen2 (q, k, v biases), Mistral (a
// sliding window of 8 under prompts of 17), a model built for sequence
// parallelism (the decode holds every row), and Mixture-of-Experts models
// (each rank routes every row with its half of each expert, the partial sums
// all-reduced): Mixtral, Qwen2-MoE's gated shared expert, experts whole on
// every rank (parallel.etp = 1) and, with 4 ranks, over 2 of TP4; DeepSeek's multi-head latent
// attention (V3 with a query rank, V2 without: every rank the same latent cache rows, its own
// heads' absorbed queries and values). With 4 or 8 ranks each pair of ranks is its own TP2 group.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/rng.h"
#include "dist/mesh.h"
#include "infer/generate.h"
#include "infer/paged_cache.h"
#include "model/arch.h"
#include "parallel_env.h"

namespace nk {
namespace {

using test::mpi;

class TensorParallelDecode : public ::testing::Test {
 protected:
  void SetUp() override {
    const int world = mpi().world_size();
    ASSERT_EQ(world % 2, 0);
    dist::MeshSpec spec;
    spec.tp = 2;
    mesh_ = std::make_unique<dist::Mesh>(world, mpi().rank(), spec);
    groups_ = std::make_unique<dist::ProcessGroups>(mpi().make_groups(*mesh_, 120));
  }

  static ModelConfig config(const std::string& preset, int64_t vocab, int64_t window = 0) {
    ModelConfig c = model_preset(preset);
    if (window) c.sliding_window = window;
    c.n_layer = 2;
    c.vocab_size = vocab;
    c.max_seq_len = std::min<int64_t>(c.max_seq_len, 64);
    return c;
  }

  static std::vector<GenerationRequest> requests(int64_t vocab) {
    std::vector<GenerationRequest> reqs;
    int64_t i = 0;
    for (int64_t n : {17, 1, 6, 11, 3}) {
      GenerationRequest r;
      Rng rng(100 + uint64_t(n));
      for (int64_t j = 0; j < n; ++j) r.prompt.push_back(int32_t(rng.uniform() * double(vocab)));
      r.max_new_tokens = 6 + i;
      r.sampling.temperature = 1.0;
      r.sampling.seed = uint64_t(40 + i++);
      reqs.push_back(r);
    }
    return reqs;
  }

  struct Run {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<float>> logits;
  };
  static Run generate(Transformer& m, bool paged) {
    const std::vector<GenerationRequest> reqs = requests(m.config().vocab_size);
    Run out;
    out.logits.resize(reqs.size());
    std::unique_ptr<Generator> gen;
    if (paged) {
      PagedCacheOptions o;
      o.block_size = 4;
      o.blocks = 16;
      o.max_len = 32;
      o.max_seqs = 2;
      o.max_tokens = 10;
      o.tp = m.tensor_parallel().size();
      o.etp = m.tensor_parallel().expert_size();
      gen = std::make_unique<Generator>(
          m, nullptr, std::make_unique<PagedCache>(m.config(), m.compute_dtype(), o), 2);
    } else {
      gen = std::make_unique<Generator>(m, nullptr, 2, /*prefill_chunk=*/8);
    }
    const std::vector<GenerationResult> res =
        gen->run(reqs, {}, [&](int64_t s, const float* l, int64_t n) {
          out.logits[size_t(s)].insert(out.logits[size_t(s)].end(), l, l + n);
        });
    for (const GenerationResult& r : res) out.tokens.push_back(r.tokens);
    return out;
  }

  void check(const std::string& preset, int64_t vocab, bool sp = false, int64_t window = 0,
             bool experts_whole = false) {
    nn::TensorParallel tp{&groups_->get("tp"), sp};
    tp.experts_whole = experts_whole;
    compare(config(preset, vocab, window), tp,
            preset + (sp ? " sp" : "") + (experts_whole ? " etp 1" : ""));
  }
  // The model `c` whole on one process against its split over `tp`.
  static void compare(const ModelConfig& c, const nn::TensorParallel& tp,
                      const std::string& label) {
    Transformer whole(c, DType::F32, 11);
    Transformer split(c, DType::F32, 11, ParamInit::Random, {}, kHost, FrozenWeights::Master, {},
                      tp);
    ASSERT_LT(split.layout().count(), whole.layout().count()) << label << ": not split";
    for (bool paged : {false, true}) {
      const Run a = generate(whole, paged), b = generate(split, paged);
      ASSERT_EQ(a.tokens.size(), b.tokens.size());
      double worst = 0;
      for (size_t k = 0; k < a.tokens.size(); ++k) {
        EXPECT_EQ(a.tokens[k], b.tokens[k]) << label << (paged ? " paged" : "") << " request " << k;
        ASSERT_EQ(a.logits[k].size(), b.logits[k].size());
        for (size_t j = 0; j < a.logits[k].size(); ++j)
          worst = std::max(worst, double(std::fabs(a.logits[k][j] - b.logits[k][j])));
      }
      EXPECT_LE(worst, 2e-5) << label << (paged ? " paged" : "");
      if (mpi().rank() == 0)
        std::printf("[%s%s] TP%d decode vs one process: max |logit diff| %.3g\n", label.c_str(),
                    paged ? " paged" : "", int(tp.size()), worst);
    }
  }

  std::unique_ptr<dist::Mesh> mesh_;
  std::unique_ptr<dist::ProcessGroups> groups_;
};

TEST_F(TensorParallelDecode, Gpt2Vocab257) {
  check("gpt-tiny", 257);
}

TEST_F(TensorParallelDecode, LlamaGroupedQueryUntied) {
  check("llama-tiny", 264);
}

TEST_F(TensorParallelDecode, LlamaSequenceParallelVocab257) {
  check("llama-tiny", 257, true);
}

TEST_F(TensorParallelDecode, Qwen3QkNormsTied) {
  check("qwen3-tiny", 264);
}

TEST_F(TensorParallelDecode, Qwen2QkvBiasesTied) {
  check("qwen2-tiny", 264);
}

TEST_F(TensorParallelDecode, MistralSlidingWindow) {
  check("mistral-tiny", 264, false, 8);
}

TEST_F(TensorParallelDecode, MixtralExpertsSplit) {
  check("mixtral-tiny", 264);
}

TEST_F(TensorParallelDecode, Qwen2MoeGatedSharedExpert) {
  check("qwen2-moe-tiny", 264);
}

TEST_F(TensorParallelDecode, MixtralExpertsWholeOnEveryRank) {
  check("mixtral-tiny", 264, false, 0, /*experts_whole=*/true);
}

// Experts split over fewer ranks than the attention (TP4, etp 2: each
// expert over an expert-tp pair, the training forward's rows over the
// expert-token pairs): the decode runs every row through the rank's share,
// summed over its expert-tp pair. Four ranks a group: skipped with two.
TEST_F(TensorParallelDecode, MixtralExpertsOverTwoOfFourRanks) {
  const int world = mpi().world_size();
  if (world % 4) GTEST_SKIP() << "needs a multiple of 4 ranks, have " << world;
  dist::MeshSpec spec;
  spec.tp = 4;
  spec.etp = 2;
  const dist::Mesh mesh(world, mpi().rank(), spec);
  dist::ProcessGroups groups = mpi().make_groups(mesh, 120);
  nn::TensorParallel tp{&groups.get("tp"), false};
  tp.experts = &groups.get("expert-tp");
  tp.tokens = &groups.get("expert-token");
  ModelConfig c = config("mixtral-tiny", 264);
  c.n_kv_head = 4;  // 4 heads and 4 key/value heads, one each
  compare(c, tp, "mixtral-tiny tp 4 etp 2");
}

TEST_F(TensorParallelDecode, DeepSeekV3LatentAttention) {
  check("deepseek_v3-tiny", 264);
}

TEST_F(TensorParallelDecode, DeepSeekV2LatentAttentionNoQueryRank) {
  check("deepseek_v2-tiny", 264);
}

}  // namespace
}  // namespace nk
