// `nekton generate` (prompt file, JSONL, repeated prompts, batching, stop
// strings) and `nekton eval perplexity` (text file, indexed dataset, JSON
// output, bad inputs) on the counting model (tests/infer/counting_model.h):
// over bytes, greedy, it continues "abc" with "defg...".
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "ckpt/model_io.h"
#include "data/dataset/indexed_dataset.h"
#include "data/tokenizer/tokenizer.h"
#include "infer/counting_model.h"
#include "infer/perplexity.h"
#include "model/tiny_config.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::run_nekton;

class GenerateEvalCli : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = d_ / "model";
    auto m = test::counting_model();
    save_model(model_, *m);
    store_tokenizer("bytes", model_);
  }
  std::string gen(const std::string& args) {
    return "generate generate.model=" + model_ + " generate.temperature=0 " + args;
  }
  test::TempDir d_{"nk_gen_cli"};
  std::string model_;
};

TEST_F(GenerateEvalCli, PromptFileBatchedEqualsEachAlone) {
  const std::string file = d_ / "prompts.txt";
  test::write_file(file, "abc\nx\n\nhello\r\n");  // blank lines are skipped
  auto r = run_nekton(
      gen("generate.prompt_file=" + file + " generate.batch_size=2 generate.max_tokens=5"), false);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out,
            "=== prompt 0 (5 tokens, length) ===\nabcdefgh\n"
            "=== prompt 1 (5 tokens, length) ===\nxyz{|}\n"
            "=== prompt 2 (5 tokens, length) ===\nhellopqrst\n");
  // One prompt streams: the same continuation.
  r = run_nekton(gen("generate.prompt=hello generate.max_tokens=5"), false);
  EXPECT_EQ(r.out, "hellopqrst\n");
  // Repeated keys and a JSON list give several prompts too.
  r = run_nekton(gen("generate.prompt=abc generate.prompt=x generate.max_tokens=2"), false);
  EXPECT_TRUE(contains(r.out, "abcde\n=== prompt 1 (2 tokens, length) ===\nxyz\n")) << r.out;
  r = run_nekton(gen("'generate.prompt=[\"k\",\"s\"]' generate.max_tokens=1"), false);
  EXPECT_TRUE(contains(r.out, "===\nkl\n") && contains(r.out, "===\nst\n")) << r.out;
}

TEST_F(GenerateEvalCli, JsonlPromptFile) {
  const std::string file = d_ / "prompts.jsonl";
  test::write_file(file, "{\"prompt\": \"abc\", \"id\": 1}\n{\"text\": \"mn\"}\n");
  auto r = run_nekton(gen("generate.prompt_file=" + file + " generate.max_tokens=3"), false);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "===\nabcdef\n") && contains(r.out, "===\nmnopq\n")) << r.out;
  test::write_file(file, "{\"prompt\": \"abc\"}\n{\"other\": 2}\n");
  r = run_nekton(gen("generate.prompt_file=" + file));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "generate.prompt_file") && contains(r.out, ":2:")) << r.out;
}

TEST_F(GenerateEvalCli, StopStrings) {
  auto r = run_nekton(gen("generate.prompt=abc generate.stop=ef generate.max_tokens=10"), false);
  EXPECT_EQ(r.out, "abcd\n");
  r = run_nekton(
      gen("generate.prompt=abc generate.stop=zz generate.stop=fg generate.max_tokens=10"), false);
  EXPECT_EQ(r.out, "abcde\n");
  r = run_nekton(gen("generate.prompt=abc generate.prompt=pq 'generate.stop=[\"u\",\"e\"]' "
                     "generate.max_tokens=10"),
                 false);
  EXPECT_TRUE(contains(r.out, "(2 tokens, stop) ===\nabcd\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "(4 tokens, stop) ===\npqrst\n")) << r.out;
  r = run_nekton(gen("generate.prompt=abc generate.min_p=1.5"));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "generate.min_p")) << r.out;
}

// generate.kv_cache_dtype: the counting model's continuation does not read
// the cache's values (its attention output is zeroed), so every dtype gives
// it; the log line names the cache's dtype and its bytes per position (one
// layer, 2 kv heads of 32: 512 bytes in f32, half in bf16 or f16, 4 x 34 in
// q8_0). A bad value names the key, before the model loads;
// serve.kv_cache_dtype too.
TEST_F(GenerateEvalCli, KvCacheDtype) {
  for (auto [dt, bytes] :
       {std::pair{"auto", 512}, {"f32", 512}, {"bf16", 256}, {"f16", 256}, {"q8_0", 136}}) {
    SCOPED_TRACE(dt);
    auto r =
        run_nekton(gen("generate.prompt=abc generate.max_tokens=5 generate.kv_cache_dtype=") + dt);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(contains(r.out, "abcdefgh\n")) << r.out;
    const std::string kv = std::string(dt) == "auto" ? "f32" : dt;
    EXPECT_TRUE(
        contains(r.out, fmt::format("KV cache {} (compute f32): {} bytes/token", kv, bytes)))
        << r.out;
  }
  auto r = run_nekton(gen("generate.prompt=abc generate.kv_cache_dtype=fp8"));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "generate.kv_cache_dtype: 'fp8' is not a KV cache dtype")) << r.out;
  r = run_nekton("serve serve.model=" + d_ / "absent" + " serve.kv_cache_dtype=int8");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "serve.kv_cache_dtype: 'int8' is not a KV cache dtype")) << r.out;
}

TEST_F(GenerateEvalCli, EvalTextFileAndIndexedDataset) {
  const std::string text = d_ / "t.txt", json = d_ / "ppl.json";
  std::string body;
  for (int i = 0; i < 3; ++i) body += "abcdefghijklmnopqrstuvwxyz";
  test::write_file(text, body);
  auto r = run_nekton("eval perplexity eval.model=" + model_ + " eval.text=" + text +
                      " eval.window=16 eval.stride=5 eval.output=" + json);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "tokens scored 77")) << r.out;
  auto j = nlohmann::json::parse(test::read_file(json));
  EXPECT_EQ(j["tokens_scored"], 77);
  auto m = load_model(model_, DType::F32);
  std::vector<int32_t> ids(body.begin(), body.end());
  PerplexityResult want = evaluate_perplexity(*m, ids, {16, 5});
  EXPECT_NEAR(j["mean_loss"].get<double>(), want.mean_loss, 1e-9 + 1e-6 * want.mean_loss);
  EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(want.mean_loss), 1e-5 * want.perplexity);

  const std::string prefix = d_ / "ds";
  {
    IndexedDatasetWriter w(prefix, IndexDType::I32);
    w.add_document(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7});
    w.add_document(std::vector<int32_t>{40, 41, 42, 43, 44});
    w.finish();
  }
  r = run_nekton("eval perplexity eval.model=" + model_ + " eval.data_prefix=" + prefix +
                 " eval.window=8 eval.output=" + json);
  ASSERT_EQ(r.code, 0) << r.out;
  j = nlohmann::json::parse(test::read_file(json));
  EXPECT_EQ(j["tokens_scored"], 11);
  want = evaluate_perplexity(*m, {1, 2, 3, 4, 5, 6, 7, 40, 41, 42, 43, 44}, {8, -1});
  EXPECT_NEAR(j["mean_loss"].get<double>(), want.mean_loss, 1e-6 * want.mean_loss);
  r = run_nekton("eval perplexity eval.model=" + model_ + " eval.data_prefix=" + prefix +
                 " eval.max_tokens=5");
  EXPECT_TRUE(contains(r.out, "tokens scored 4")) << r.out;
}

TEST_F(GenerateEvalCli, EvalBadInputsNameTheKey) {
  const std::string text = d_ / "t.txt", one = d_ / "one.txt";
  test::write_file(text, "abcdefghijklmnopqrstuvwxyz");
  test::write_file(one, "a");
  const std::string base = "eval perplexity eval.model=" + model_ + " ";
  auto expect_error = [&](const std::string& args, const std::string& key) {
    auto r = run_nekton(base + args);
    EXPECT_EQ(r.code, 1) << args << ": " << r.out;
    EXPECT_TRUE(contains(r.out, key)) << args << ": " << r.out;
  };
  expect_error("eval.text=" + text + " eval.window=65", "eval.window");
  expect_error("eval.text=" + text + " eval.stride=0", "eval.stride");
  expect_error("eval.text=" + text + " eval.window=8 eval.stride=9", "eval.stride");
  expect_error("eval.text=" + d_ / "missing.txt", "eval.text");
  expect_error("eval.text=" + one, "eval.text: 1 token(s)");
  expect_error("eval.data_prefix=" + d_ / "nope", "eval.data_prefix");
  expect_error("", "eval.text");
  expect_error("eval.txt=" + text, "eval.text");  // unknown key names the nearest
  auto r = run_nekton("eval accuracy");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "perplexity")) << r.out;
}

// A model of 300 rows over the byte tokenizer's 257 ids (vocabulary padding,
// as Megatron's and Qwen2's): hot sampling over many tokens exits 0 and never
// emits a padding id, nor lists one among the top logprobs, in generate or
// eval logprobs; the padding is logged once. A model with fewer rows than
// the tokenizer has ids is refused by generate and eval, naming both sizes
// and both sources, before anything runs.
TEST_F(GenerateEvalCli, PaddedVocabularyNeverSamplesPadding) {
  const std::string padded = d_ / "padded", small = d_ / "small";
  ModelConfig c = test::tiny_config(false, 300, 512);
  c.init_std = 0.5;  // logits spread over several units: padding ids would win often
  {
    Transformer m(c, DType::F32, 7);
    save_model(padded, m);
    store_tokenizer("bytes", padded);
  }
  auto r = run_nekton("generate generate.model=" + padded +
                          " generate.prompt=abc generate.temperature=4 generate.top_k=0 "
                          "generate.top_p=1 generate.max_tokens=400 generate.ignore_eos=true "
                          "generate.logprobs=5 generate.format=jsonl",
                      false);
  ASSERT_EQ(r.code, 0) << r.out;
  int64_t lines = 0;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_LT(j["id"].get<int>(), 257) << line;
    EXPECT_FALSE(j["token"].is_null()) << line;
    for (const auto& t : j["top_logprobs"]) EXPECT_LT(t["id"].get<int>(), 257) << line;
    ++lines;
  }
  EXPECT_EQ(lines, 400);
  r = run_nekton("generate generate.model=" + padded +
                 " generate.prompt=abc generate.max_tokens=3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "[info] the model's vocabulary has 300 rows (model folder '" +
                                  padded + "'), the tokenizer 257 ids"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "ids 257..299 are padding")) << r.out;

  const std::string text = d_ / "t.txt";
  test::write_file(text, "the quick brown fox jumps over the lazy dog");
  r = run_nekton("eval logprobs eval.model=" + padded + " eval.text=" + text +
                     " eval.top_k=20 eval.format=jsonl",
                 false);
  ASSERT_EQ(r.code, 0) << r.out;
  std::istringstream ev(r.out);
  lines = 0;
  for (std::string line; std::getline(ev, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    ASSERT_EQ(j["top_logprobs"].size(), 20u) << line;
    for (const auto& t : j["top_logprobs"]) EXPECT_LT(t["id"].get<int>(), 257) << line;
    ++lines;
  }
  EXPECT_EQ(lines, 42);

  c.vocab_size = 200;
  {
    Transformer m(c, DType::F32, 7);
    save_model(small, m);
    store_tokenizer("bytes", small);
  }
  for (const std::string& args : {"generate generate.model=" + small + " generate.prompt=abc",
                                  "eval perplexity eval.model=" + small + " eval.text=" + text,
                                  "eval logprobs eval.model=" + small + " eval.text=" + text}) {
    r = run_nekton(args);
    EXPECT_EQ(r.code, 1) << args << ": " << r.out;
    EXPECT_TRUE(contains(r.out, "the model's vocabulary has 200 rows (model folder '" + small +
                                    "') but the tokenizer has 257 ids (the tokenizer saved "
                                    "with the model, 'bytes')"))
        << args << ": " << r.out;
    EXPECT_TRUE(contains(r.out, ".model: ")) << r.out;
  }
}

}  // namespace
}  // namespace nk
