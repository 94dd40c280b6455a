// The KV-cache Generator: greedy output equals re-running the whole context
// per token (the engine it replaced); a batch of prompts of different lengths
// (more prompts than slots) gives each prompt's tokens and logits alone;
// stop strings (split across tokens), EOS, max tokens and the context limit;
// streamed pieces add up to the text.
#include "infer/generate.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "data/tokenizer/tokenizer.h"
#include "infer/counting_model.h"
#include "infer/model_source.h"
#include "test_util.h"

#include "model/tiny_config.h"

namespace nk {
namespace {

ModelConfig tiny(bool llama) {
  return test::tiny_config(llama, 60, 48);
}

std::vector<int32_t> random_tokens(int64_t n, uint64_t seed, int64_t V) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng.below(uint64_t(V)));
  return t;
}

// The previous engine: the whole context through forward_last_logits for
// every new token, greedy.
std::vector<int32_t> greedy_by_recompute(Transformer& m, std::vector<int32_t> ctx, int64_t n) {
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

GenerationRequest greedy(std::vector<int32_t> prompt, int64_t n) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = n;
  r.sampling.temperature = 0;
  return r;
}

TEST(Generate, GreedyEqualsRecomputingTheContext) {
  for (bool llama : {false, true}) {
    Transformer m(tiny(llama), DType::F32, 3);
    Generator gen(m, nullptr, 2);
    std::vector<int32_t> p = random_tokens(9, 7, m.config().vocab_size);
    auto res = gen.run({greedy(p, 20)});
    EXPECT_EQ(res[0].tokens, greedy_by_recompute(m, p, 20)) << (llama ? "llama" : "gpt2");
    EXPECT_EQ(res[0].finish, FinishReason::Length);
  }
}

// Five prompts of lengths 1..17 through 2 slots (continuous batching, mixed
// prefill and decode steps), sampled at temperature 1 with per-prompt seeds:
// the same tokens as each prompt alone, and logits within 2e-5 (f32; only the
// matrix products' row counts differ). Measured difference is printed.
TEST(Generate, BatchEqualsEachPromptAlone) {
  for (bool llama : {false, true}) {
    Transformer m(tiny(llama), DType::F32, 4);
    const int64_t V = m.config().vocab_size;
    std::vector<GenerationRequest> reqs;
    int64_t i = 0;
    for (int64_t n : {17, 1, 6, 11, 3}) {
      GenerationRequest r;
      r.prompt = random_tokens(n, 100 + uint64_t(n), V);
      r.max_new_tokens = 6 + i;
      r.sampling.temperature = 1.0;
      r.sampling.seed = uint64_t(40 + i++);
      reqs.push_back(r);
    }
    std::vector<std::vector<float>> batched(reqs.size()), alone(reqs.size());
    Generator gen(m, nullptr, 2, /*prefill_chunk=*/8);
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
      for (size_t j = 0; j < alone[k].size(); ++j)
        worst = std::max(worst, double(std::fabs(batched[k][j] - alone[k][j])));
    }
    EXPECT_LE(worst, 2e-5);
    std::printf("[%s] batched vs alone: max |logit diff| %.3g\n", llama ? "llama" : "gpt2", worst);
  }
}

TEST(Generate, CountingModelStopsAtStopStringsSplitAcrossTokens) {
  auto m = test::counting_model();
  auto tok = load_tokenizer("bytes");
  Generator gen(*m, tok.get(), 3);
  GenerationRequest plain = greedy(tok->encode("a"), 10);
  GenerationRequest stop = plain, two = plain, none = plain;
  stop.stop = {"efg"};       // "bcd" then the three-token stop string
  two.stop = {"xyz", "de"};  // the earliest match of any
  none.stop = {"bd"};        // a prefix of it shows up ("b"), the rest never
  std::vector<std::string> streamed(4);
  auto res = gen.run({plain, stop, two, none}, [&](int64_t s, int32_t, std::string_view piece) {
    streamed[size_t(s)] += piece;
  });
  EXPECT_EQ(res[0].text, "bcdefghijk");
  EXPECT_EQ(res[0].finish, FinishReason::Length);
  EXPECT_EQ(res[1].text, "bcd");
  EXPECT_EQ(res[1].finish, FinishReason::Stop);
  EXPECT_EQ(res[1].tokens.size(), 6u);  // b c d e f g: the stop string's tokens are generated
  EXPECT_EQ(res[2].text, "bc");
  EXPECT_EQ(res[3].text, "bcdefghijk");
  for (size_t s = 0; s < 4; ++s) EXPECT_EQ(streamed[s], res[s].text) << s;
}

TEST(Generate, CountingModelEosAndContextLimit) {
  auto m = test::counting_model();
  auto tok = load_tokenizer("bytes");
  ASSERT_EQ(tok->eod_id(), 256);
  Generator gen(*m, tok.get(), 2);
  GenerationRequest eos = greedy({250}, 20), through = eos, ctx = greedy({}, 100);
  through.stop_at_eos = false;
  through.max_new_tokens = 8;
  for (int i = 0; i < 60; ++i) ctx.prompt.push_back(int32_t('a'));
  int64_t eos_calls = 0;
  auto res = gen.run({eos, through, ctx}, [&](int64_t s, int32_t id, std::string_view) {
    eos_calls += s == 0 && id == 256;
  });
  EXPECT_EQ(res[0].tokens, (std::vector<int32_t>{251, 252, 253, 254, 255}));
  EXPECT_EQ(res[0].finish, FinishReason::Eos);
  EXPECT_EQ(eos_calls, 1);
  EXPECT_EQ(res[1].tokens, (std::vector<int32_t>{251, 252, 253, 254, 255, 256, 0, 1}));
  EXPECT_EQ(res[1].finish, FinishReason::Length);
  // max_seq_len 64: positions 0..63 can be fed, so 60 prompt tokens leave 5.
  EXPECT_EQ(res[2].tokens.size(), 5u);
  EXPECT_EQ(res[2].finish, FinishReason::Context);
}

// A chat model's other end-of-turn ids (generation_config.json's
// eos_token_id list) end a sequence as the eod does.
TEST(Generate, EndIdsEndLikeTheEod) {
  auto m = test::counting_model();
  auto tok = load_tokenizer("bytes");
  Generator gen(*m, tok.get(), 2);
  gen.set_end_ids({253});
  GenerationRequest stops = greedy({250}, 20), through = stops;
  through.stop_at_eos = false;
  through.max_new_tokens = 5;
  auto res = gen.run({stops, through});
  EXPECT_EQ(res[0].tokens, (std::vector<int32_t>{251, 252}));
  EXPECT_EQ(res[0].finish, FinishReason::Eos);
  EXPECT_EQ(res[1].tokens, (std::vector<int32_t>{251, 252, 253, 254, 255}));

  test::TempDir d("nk_gen_config");
  const std::string dir = d.path().string();
  EXPECT_TRUE(generation_end_ids(dir, *tok, 257).empty());  // no file
  test::write_file(dir + "/generation_config.json", R"({"eos_token_id": [256, 5, 7, 5]})");
  EXPECT_EQ(generation_end_ids(dir, *tok, 257), (std::vector<int32_t>{5, 7}));  // eod left out
  test::write_file(dir + "/generation_config.json", R"({"eos_token_id": 9, "temperature": 0.6})");
  EXPECT_EQ(generation_end_ids(dir, *tok, 257), (std::vector<int32_t>{9}));
  test::write_file(dir + "/generation_config.json", R"({"eos_token_id": [999]})");
  std::string e = test::error_of([&] { generation_end_ids(dir, *tok, 257); });
  EXPECT_TRUE(test::contains(e, dir + "/generation_config.json")) << e;
  EXPECT_TRUE(test::contains(e, "eos_token_id[0]")) << e;
  test::write_file(dir + "/generation_config.json", R"({"eos_token_id": "x"})");
  EXPECT_THROW(generation_end_ids(dir, *tok, 257), Error);
}

TEST(Generate, StreamableEndHoldsStopPrefixesAndSplitCharacters) {
  EXPECT_EQ(streamable_end("hello wor", 0, {"world"}), 6u);
  EXPECT_EQ(streamable_end("hello", 0, {"xy"}), 5u);
  EXPECT_EQ(streamable_end("caf\xC3", 0, {}), 3u);  // é = C3 A9, half of it
  EXPECT_EQ(streamable_end("caf\xC3\xA9", 0, {}), 5u);
  EXPECT_EQ(streamable_end("\xE2\x82", 0, {}), 0u);       // 2 of 3 bytes of €
  EXPECT_EQ(streamable_end("a\xF0\x9F\x98", 0, {}), 1u);  // 3 of 4 bytes of an emoji
  EXPECT_EQ(streamable_end("ab\n\n", 0, {"\n\n\n"}), 2u);
}

TEST(Generate, BadRequestsAreErrors) {
  Transformer m(tiny(false), DType::F32, 3);
  Generator gen(m, nullptr, 1);
  EXPECT_TRUE(
      test::contains(test::error_of([&] { gen.run({greedy({}, 3)}); }), "prompt 0 is empty"));
  EXPECT_TRUE(test::contains(test::error_of([&] {
                               gen.run({greedy({1}, 3), greedy({60}, 3)});
                             }),
                             "prompt 1: token 60"));
  GenerationRequest r = greedy({1, 2}, 3);
  r.sampling.min_p = 2;
  EXPECT_TRUE(test::contains(test::error_of([&] { gen.run({r}); }), "min_p"));
  r = greedy({1}, 3);
  r.stop = {"x"};
  EXPECT_TRUE(test::contains(test::error_of([&] { gen.run({r}); }), "need a tokenizer"));
}

// A model of 300 rows over the byte tokenizer's 257 ids (vocabulary
// padding, as Megatron and most Hugging Face checkpoints have): hot sampling
// over many tokens never gives a padding id, the top logprobs never list one
// and the logprobs are the softmax over the tokenizer's ids; without a
// tokenizer the same requests do sample padding ids (the test could fail).
// A tokenizer with more ids than the model has rows is refused.
TEST(Generate, PaddingIdsAreNeverSampledNorListed) {
  Transformer m(test::tiny_config(false, 300, 64), DType::F32, 4);
  auto tok = load_tokenizer("bytes");
  const int64_t real = tok->vocab_size();
  ASSERT_EQ(real, 257);
  std::vector<GenerationRequest> reqs;
  for (uint64_t i = 0; i < 4; ++i) {
    GenerationRequest r = greedy(random_tokens(5, 10 + i, real), 60);
    r.sampling.temperature = i == 0 ? 0.0 : 3.0;
    r.sampling.seed = i;
    r.stop_at_eos = false;
    r.logprobs = true;
    r.top_logprobs = kMaxTopLogprobs;
    reqs.push_back(r);
  }
  Generator gen(m, tok.get(), 4);
  std::vector<std::vector<float>> seen(reqs.size());
  const std::vector<GenerationResult> res =
      gen.run(reqs, {}, [&](int64_t i, const float* l, int64_t V) {
        EXPECT_EQ(V, 300);
        seen[size_t(i)].assign(l, l + V);  // the last step's
      });
  int64_t sampled = 0;
  for (size_t i = 0; i < res.size(); ++i) {
    ASSERT_EQ(res[i].tokens.size(), 60u) << i;
    for (size_t t = 0; t < res[i].tokens.size(); ++t) {
      EXPECT_LT(res[i].tokens[t], real) << i << " step " << t;
      for (const TokenLogprob& x : res[i].top_logprobs[t]) EXPECT_LT(x.token, real);
      ++sampled;
    }
    // The last token's logprob: log_softmax over the tokenizer's ids only.
    const std::vector<float>& l = seen[i];
    double mx = -INFINITY, z = 0;
    for (int64_t v = 0; v < real; ++v) mx = std::max(mx, double(l[size_t(v)]));
    for (int64_t v = 0; v < real; ++v) z += std::exp(double(l[size_t(v)]) - mx);
    EXPECT_NEAR(res[i].logprobs.back(), double(l[size_t(res[i].tokens.back())]) - mx - std::log(z),
                1e-5);
  }
  EXPECT_EQ(sampled, 240);
  // The same requests without a tokenizer: every row is a token.
  for (GenerationRequest& r : reqs) r.logprobs = false, r.top_logprobs = 0;
  Generator raw(m, nullptr, 4);
  int64_t padding = 0;
  for (const GenerationResult& r : raw.run(reqs))
    for (int32_t t : r.tokens) padding += t >= real;
  EXPECT_GT(padding, 0);
  // Prompts hold tokens only.
  EXPECT_TRUE(test::contains(test::error_of([&] {
                               gen.run({greedy({1, 280}, 3)});
                             }),
                             "token 280 at position 1 is outside the vocabulary of 257"));
  Transformer small(test::tiny_config(false, 200, 64), DType::F32, 4);
  EXPECT_TRUE(test::contains(test::error_of([&] { Generator g(small, tok.get(), 1); }),
                             "the tokenizer has 257 ids, more than the model's vocabulary of 200"));
}

}  // namespace
}  // namespace nk
