// LocalEvalModel's two scoring paths give the same log-likelihoods: whole
// right-padded rows (eval.share_prefixes=false) and the paged KV cache with
// each context computed once for all its continuations (the default), which
// takes the contexts' full blocks from the prefix cache.
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "data/tokenizer/tokenizer.h"
#include "eval/eval_model.h"
#include "model/tiny_config.h"

namespace nk {
namespace {

TEST(LocalEvalModel, SharedPrefixesScoreAsWholeRows) {
  for (bool llama : {true, false}) {
    ModelConfig c = test::tiny_config(llama, 257, 96);
    c.init_std = 0.1;  // logits far from flat, so a wrong row would show
    Transformer model(c, DType::F32, 5);
    std::unique_ptr<Tokenizer> tok = load_tokenizer("bytes");
    // Questions of 3-4 choices after contexts of 20-70 tokens (some over
    // several blocks, one shorter than a block), single- and multi-token
    // continuations, and one request alone; batches of 3 split a question.
    Rng rng(11);
    std::vector<LocalEvalModel::TokenRequest> reqs;
    for (int64_t q = 0; q < 5; ++q) {
      const int64_t n_ctx = q == 3 ? 9 : 20 + 12 * q;
      std::vector<int32_t> ctx;
      for (int64_t t = 0; t < n_ctx; ++t) ctx.push_back(int32_t(rng.below(256)));
      for (int64_t a = 0; a < (q == 4 ? 1 : 3 + q % 2); ++a) {
        std::vector<int32_t> cont;
        for (int64_t t = 0; t < 1 + (a + q) % 4; ++t) cont.push_back(int32_t(rng.below(256)));
        std::vector<int32_t> input = ctx;
        input.insert(input.end(), cont.begin(), cont.end() - 1);
        reqs.push_back({input, cont});
      }
    }
    LocalEvalModel whole(model, *tok, 3);
    whole.set_share_prefixes(false);
    LocalEvalModel shared(model, *tok, 3);
    const auto want = whole.score(reqs);
    const auto got = shared.score(reqs);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_NEAR(got[i].logprob, want[i].logprob, 1e-5 * std::abs(want[i].logprob) + 1e-6)
          << (llama ? "llama" : "gpt2") << " request " << i;
      EXPECT_EQ(got[i].greedy, want[i].greedy) << "request " << i;
    }
    // Every choice after the first of a multi-block context found its full
    // blocks computed: at least one block each.
    EXPECT_EQ(whole.shared_prefix_tokens(), 0);
    EXPECT_GE(shared.shared_prefix_tokens(), 16 * 8);
  }
}

}  // namespace
}  // namespace nk
