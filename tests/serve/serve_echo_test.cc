// /v1/completions with echo and logprobs, as lm-evaluation-harness's
// local-completions and OpenAI's legacy completions use it: the prompt's
// tokens with their log-probabilities (the first null), equal to the model's
// own full-forward ones (infer/perplexity.h's token_logprobs) within 1e-5,
// its top_logprobs holding the token; max_tokens 0 gives the prompt alone,
// max_tokens > 0 the prompt and then the completion, whose logprobs continue
// the prompt's. Bad combinations are 400s naming the field.
#include <gtest/gtest.h>
#include <httplib.h>

#include "infer/model_source.h"
#include "infer/perplexity.h"
#include "serve_test_util.h"

namespace nk {
namespace {

using json = nlohmann::json;

class ServeEcho : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = d_ / "tiny";
    test::save_ascii_model(model_, 256);
    server_ =
        std::make_unique<test::ServerProcess>(model_, std::vector<std::string>{}, d_ / "serve.log");
    ASSERT_GT(server_->port(), 0) << server_->log();
  }
  json post(const json& body, int want = 200) {
    auto cli = server_->client();
    auto r = cli.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(r) << server_->log();
    if (!r) return nullptr;
    EXPECT_EQ(r->status, want) << r->body;
    return json::parse(r->body);
  }
  // The model's own log-probabilities of `text`'s tokens 1.. (bytes).
  std::vector<ScoredToken> reference(const std::string& text) {
    ModelSourceKeys k;
    k.prefix = "test";
    k.model = model_;
    RunnableModel m = load_runnable_model(k);
    std::vector<int32_t> ids;
    m.tokenizer->encode(text, ids);
    return token_logprobs(*m.model, ids, {}, 2, {}, m.tokenizer->vocab_size());
  }

  test::TempDir d_{"nk_serve_echo"};
  std::string model_;
  std::unique_ptr<test::ServerProcess> server_;
};

TEST_F(ServeEcho, PromptLogprobsAreTheModelsOwn) {
  const std::vector<std::string> prompts = {"Hello, world: the cat sat.", "ab"};
  const json r = post({{"prompt", prompts},
                       {"echo", true},
                       {"logprobs", 2},
                       {"max_tokens", 0},
                       {"model", nullptr}});
  ASSERT_EQ(r["choices"].size(), 2u) << r.dump();
  EXPECT_EQ(r["usage"]["completion_tokens"], 0);
  EXPECT_EQ(r["usage"]["prompt_tokens"], int64_t(prompts[0].size() + prompts[1].size()));
  for (size_t p = 0; p < prompts.size(); ++p) {
    const json& c = r["choices"][p];
    EXPECT_EQ(c["index"], p);
    EXPECT_EQ(c["text"], prompts[p]);
    EXPECT_EQ(c["finish_reason"], "length");
    const json& lp = c["logprobs"];
    const size_t n = prompts[p].size();
    ASSERT_EQ(lp["tokens"].size(), n) << lp.dump();
    ASSERT_EQ(lp["token_logprobs"].size(), n);
    ASSERT_EQ(lp["top_logprobs"].size(), n);
    ASSERT_EQ(lp["text_offset"].size(), n);
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    EXPECT_TRUE(lp["top_logprobs"][0].is_null());
    const std::vector<ScoredToken> ref = reference(prompts[p]);
    ASSERT_EQ(ref.size(), n - 1);
    for (size_t t = 0; t < n; ++t) {
      EXPECT_EQ(lp["tokens"][t], std::string(1, prompts[p][t]));
      EXPECT_EQ(lp["text_offset"][t], t);
      if (t == 0) continue;
      const double x = lp["token_logprobs"][t].get<double>();
      EXPECT_NEAR(x, ref[t - 1].logprob, 1e-5) << p << " " << t;
      const json& top = lp["top_logprobs"][t];
      // The two most likely, and the token itself.
      EXPECT_GE(top.size(), 2u);
      EXPECT_LE(top.size(), 3u);
      EXPECT_NEAR(top.at(std::string(1, prompts[p][t])).get<double>(), x, 1e-12);
      for (const TokenLogprob& k : ref[t - 1].top)
        EXPECT_NEAR(top.at(std::string(1, char(k.token))).get<double>(), k.logprob, 1e-5);
    }
  }
  // A one-token prompt: its token, nothing predicts it.
  const json one = post({{"prompt", "H"}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 0}});
  EXPECT_EQ(one["choices"][0]["logprobs"]["token_logprobs"], json::array({nullptr}));
}

TEST_F(ServeEcho, EchoWithACompletionContinuesThePromptsLogprobs) {
  const std::string prompt = "The blue hat";
  const json plain =
      post({{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"logprobs", 1}});
  const json r = post(
      {{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"echo", true}, {"logprobs", 1}});
  const json& c = r["choices"][0];
  const std::string completion = plain["choices"][0]["text"];
  EXPECT_EQ(c["text"], prompt + completion);
  const json& lp = c["logprobs"];
  const size_t n = prompt.size();
  ASSERT_EQ(lp["tokens"].size(), n + 4) << lp.dump();
  for (size_t t = 0; t < n + 4; ++t) EXPECT_EQ(lp["text_offset"][t], t);
  const json& gen = plain["choices"][0]["logprobs"];
  for (size_t t = 0; t < 4; ++t) {
    EXPECT_EQ(lp["tokens"][n + t], gen["tokens"][t]);
    EXPECT_NEAR(lp["token_logprobs"][n + t].get<double>(), gen["token_logprobs"][t].get<double>(),
                1e-6);
  }
  const std::vector<ScoredToken> ref = reference(prompt);
  for (size_t t = 1; t < n; ++t)
    EXPECT_NEAR(lp["token_logprobs"][t].get<double>(), ref[t - 1].logprob, 1e-5);
}

TEST_F(ServeEcho, BadCombinationsName400Fields) {
  auto param = [&](const json& body) {
    const json e = post(body, 400);
    return e.is_null() ? std::string() : e["error"].value("param", std::string());
  };
  EXPECT_EQ(param({{"prompt", "a"}, {"max_tokens", 0}}), "max_tokens");
  EXPECT_EQ(param({{"prompt", "a"}, {"max_tokens", 0}, {"echo", true}, {"stream", true}}),
            "stream");
  EXPECT_EQ(param({{"prompt", "a"}, {"echo", true}, {"logprobs", 1}, {"stream", true}}), "stream");
  EXPECT_EQ(param({{"prompt", "a"}, {"max_tokens", -1}, {"echo", true}}), "max_tokens");
  // A prompt scored alone may fill the context (256); one more token may not.
  EXPECT_EQ(post({{"prompt", std::string(256, 'a')}, {"max_tokens", 0}, {"echo", true}})["choices"]
                .size(),
            1u);
  EXPECT_EQ(param({{"prompt", std::string(257, 'a')}, {"max_tokens", 0}, {"echo", true}}),
            "prompt");
}

}  // namespace
}  // namespace nk
