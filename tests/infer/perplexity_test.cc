// evaluate_perplexity against a direct computation: Hugging Face's loop
// written out (max_length = window + 1 tokens per window, labels before the
// previous window's end ignored), log-softmax in double over
// forward_all_logits. f32; tolerance 1e-5 relative on the mean loss (float
// means and sums of ~50 terms). A p-tuned model reads each window after its
// virtual tokens, as PEFT prepends them. Bad options are errors naming the key.
#include "infer/perplexity.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "test_util.h"

#include "model/tiny_config.h"

namespace nk {
namespace {

ModelConfig tiny() {
  return test::tiny_config(true, 40, 16);
}

// Hugging Face's sliding-window perplexity loop, as in its documentation;
// with p-tuning, the P virtual tokens fed first and their logits dropped.
std::pair<double, int64_t> hf_reference(Transformer& m, const std::vector<int32_t>& ids,
                                        int64_t max_length, int64_t stride) {
  const int64_t L = int64_t(ids.size()), V = m.config().vocab_size,
                P = m.config().prompt.virtual_tokens;
  double nll = 0;
  int64_t count = 0, prev_end = 0;
  for (int64_t begin = 0; begin < L; begin += stride) {
    const int64_t end = std::min(begin + max_length, L), trg_len = end - prev_end;
    // The window's last token is only a label: feed the T - 1 before it.
    const int64_t T = end - begin, Tin = T - 1;
    Activations a(m.config(), DType::F32, 1, P + Tin, false);
    Tensor t = Tensor::empty({1, P + Tin}, DType::I32),
           lg = Tensor::empty({P + Tin, V}, DType::F32);
    std::vector<int32_t> in(size_t(P), 7);  // the virtual tokens' ids do not matter
    in.insert(in.end(), ids.begin() + begin, ids.begin() + begin + Tin);
    ops::copy_bytes_from_host(t, in.data());
    m.forward_all_logits(a, t, lg);
    std::vector<float> h(size_t((P + Tin) * V));
    ops::copy_to_host(lg, h.data());
    // labels[i] = ids[begin + i] for i >= T - trg_len, predicted from row i - 1.
    for (int64_t i = std::max<int64_t>(1, T - trg_len); i < T; ++i) {
      const float* row = h.data() + (P + i - 1) * V;
      double mx = row[0], z = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
      nll += std::log(z) + mx - double(row[ids[size_t(begin + i)]]);
      ++count;
    }
    prev_end = end;
    if (end == L) break;
  }
  return {nll / double(count), count};
}

TEST(Perplexity, MatchesHuggingFaceLoop) {
  Transformer m(tiny(), DType::F32, 9);
  ModelConfig prompted = tiny();
  prompted.prompt = PromptConfig{3, 8};
  prompted.max_seq_len = 19;  // the longest window after 3 virtual tokens
  Transformer pm(prompted, DType::F32, 9);
  Rng rng(1);
  std::vector<int32_t> ids(53);
  for (auto& x : ids) x = int32_t(rng.below(40));
  for (auto [W, S] : {std::pair<int64_t, int64_t>{16, 16}, {16, 5}, {16, 1}, {7, 3}, {16, 15}}) {
    PerplexityOptions o;
    o.window = W;
    o.stride = S;
    PerplexityResult r = evaluate_perplexity(m, ids, o);
    auto [want, count] = hf_reference(m, ids, W + 1, S);
    EXPECT_EQ(r.tokens_scored, 52) << W << "/" << S;
    EXPECT_EQ(count, 52);
    EXPECT_NEAR(r.mean_loss, want, 1e-5 * want) << W << "/" << S;
    EXPECT_NEAR(r.perplexity, std::exp(want), 1e-4 * std::exp(want));
    auto [pwant, pcount] = hf_reference(pm, ids, W + 1, S);
    const PerplexityResult pr = evaluate_perplexity(pm, ids, o);
    EXPECT_EQ(pr.tokens_scored, pcount);
    EXPECT_NEAR(pr.mean_loss, pwant, 1e-5 * pwant) << "p-tuned " << W << "/" << S;
    EXPECT_NE(pr.mean_loss, r.mean_loss);  // the prompt matters
  }
  // stride = window: ceil(52 / 16) = 4 disjoint windows.
  EXPECT_EQ(evaluate_perplexity(m, ids, {16, -1}).windows, 4);
  // A shorter context scores worse-informed tokens: the losses differ.
  EXPECT_NE(evaluate_perplexity(m, ids, {16, 1}).mean_loss,
            evaluate_perplexity(m, ids, {2, 2}).mean_loss);
}

TEST(Perplexity, BadOptionsNameTheKey) {
  Transformer m(tiny(), DType::F32, 9);
  std::vector<int32_t> ids = {1, 2, 3, 4, 5};
  auto err = [&](int64_t W, int64_t S, std::vector<int32_t> t) {
    return test::error_of([&] { evaluate_perplexity(m, t, {W, S}); });
  };
  EXPECT_TRUE(test::contains(err(17, -1, ids), "eval.window")) << err(17, -1, ids);
  EXPECT_TRUE(test::contains(err(8, 0, ids), "eval.stride"));
  EXPECT_TRUE(test::contains(err(8, 9, ids), "eval.stride"));
  EXPECT_TRUE(test::contains(err(8, 4, {3}), "at least 2"));
  EXPECT_TRUE(test::contains(err(8, 4, {3, 41}), "outside the model's vocabulary"));
  ModelConfig prompted = tiny();
  prompted.prompt = PromptConfig{3, 8};
  Transformer pm(prompted, DType::F32, 9);
  EXPECT_TRUE(test::contains(test::error_of([&] {
                               evaluate_perplexity(pm, ids, {16, -1});
                             }),
                             "eval.window: 16 must be in [1, model.max_seq_len = 16 - 3 virtual "
                             "tokens]"));
}

}  // namespace
}  // namespace nk
