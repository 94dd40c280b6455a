// `nekton serve` over a model whose vocabulary is padded past its
// tokenizer's (300 rows, the byte tokenizer's 257 ids, as Megatron and most
// Hugging Face checkpoints pad): every completion and chat request, greedy
// or hot, answers 200 and never emits a padding id, although the padding
// rows hold the largest logits; a model with fewer rows than the tokenizer
// has ids is refused at start, naming both sizes.
#include <gtest/gtest.h>
#include <httplib.h>

#include "serve_test_util.h"

namespace nk {
namespace {

using json = nlohmann::json;
using test::contains;
using test::ServerProcess;

bool printable(const std::string& s) {
  for (unsigned char ch : s)
    if (ch < 32 || ch > 126) return false;
  return true;
}

TEST(ServeVocabulary, PaddedModelAnswersEveryRequest) {
  test::TempDir d("nk_serve_vocab");
  const std::string model = d / "padded";
  test::save_ascii_model(model, 2048, true, 300);
  ServerProcess server(model, {}, d / "serve.log");
  ASSERT_GT(server.port(), 0) << server.log();
  EXPECT_TRUE(contains(server.log(), "ids 257..299 are padding")) << server.log();
  auto cli = server.client();
  // Sampled with top_k 20: the printable ids' logits outrank the zero rows
  // of the other bytes, while the padding rows (3 x) would outrank them all.
  for (double temperature : {0.0, 1.0, 1.5}) {
    SCOPED_TRACE(temperature);
    const json completion = {{"prompt", "The quick brown fox"},
                             {"max_tokens", 40},
                             {"temperature", temperature},
                             {"top_k", 20},
                             {"seed", 5},
                             {"logprobs", 5}};
    auto r = cli.Post("/v1/completions", completion.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json c = json::parse(r->body);
    const std::string text = c["choices"][0]["text"];
    EXPECT_EQ(c["usage"]["completion_tokens"], 40) << r->body;
    EXPECT_TRUE(printable(text)) << text;
    const json chat = {{"messages", {{{"role", "user"}, {"content", "Hello there"}}}},
                       {"max_tokens", 30},
                       {"temperature", temperature},
                       {"top_k", 20},
                       {"seed", 6},
                       {"logprobs", true},
                       {"top_logprobs", 5}};
    r = cli.Post("/v1/chat/completions", chat.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json m = json::parse(r->body);
    EXPECT_TRUE(printable(m["choices"][0]["message"]["content"])) << r->body;
    // Each listed alternative is a printable byte: no padding id among them.
    for (const json& t : m["choices"][0]["logprobs"]["content"])
      for (const json& alt : t["top_logprobs"])
        EXPECT_TRUE(printable(alt["token"].get<std::string>())) << alt.dump();
  }
  EXPECT_EQ(server.stop(SIGTERM), 0) << server.log();
}

TEST(ServeVocabulary, ModelSmallerThanTheTokenizerIsRefused) {
  test::TempDir d("nk_serve_vocab_small");
  const std::string model = d / "small";
  test::save_ascii_model(model, 2048, true, 200);
  ServerProcess server(model, {}, d / "serve.log");
  EXPECT_EQ(server.port(), 0) << server.log();
  EXPECT_EQ(server.stop(SIGKILL), 1) << server.log();
  EXPECT_TRUE(contains(server.log(),
                       "serve.model: the model's vocabulary has 200 rows (model "
                       "folder '" +
                           model + "') but the tokenizer has 257 ids"))
      << server.log();
}

}  // namespace
}  // namespace nk
