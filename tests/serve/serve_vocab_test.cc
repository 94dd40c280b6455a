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

// save_ascii_model's shape with `vocab` rows: the printable ids' head rows
// random, and the rows past the tokenizer's 257 ids (the padding) each a
// printable row times 3, so that without the mask a padding id would win
// almost every step.
void save_padded_model(const std::string& dir, int64_t vocab) {
  ModelConfig c;
  c.arch = "gpt2";
  c.vocab_size = vocab;
  c.max_seq_len = 512;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_kv_head = 2;
  c.d_model = 32;
  c.d_ff = 64;
  c.tied_embeddings = false;
  c.init_std = 0.5;
  Transformer m(c, DType::F32, 11);
  Tensor head = ParamLayout::view(m.params(), m.layout().find("lm_head.weight"));
  std::vector<float> w(size_t(head.numel()), 0.f);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 0.9f);
  for (int64_t v = 32; v < 127; ++v)
    for (int64_t i = 0; i < c.d_model; ++i) w[size_t(v * c.d_model + i)] = normal(rng);
  for (int64_t v = 257; v < vocab; ++v)
    for (int64_t i = 0; i < c.d_model; ++i)
      w[size_t(v * c.d_model + i)] = 3 * w[size_t((32 + v % 95) * c.d_model + i)];
  ops::copy_from_host(head, w.data());
  m.sync_compute_params();
  save_model(dir, m);
  store_tokenizer("bytes", dir);
  test::write_file(dir + "/tokenizer_config.json",
                   json{{"chat_template", find_chat_template("chatml").jinja()}}.dump());
}

bool printable(const std::string& s) {
  for (unsigned char ch : s)
    if (ch < 32 || ch > 126) return false;
  return true;
}

TEST(ServeVocabulary, PaddedModelAnswersEveryRequest) {
  test::TempDir d("nk_serve_vocab");
  const std::string model = d / "padded";
  save_padded_model(model, 300);
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
  save_padded_model(model, 200);
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
