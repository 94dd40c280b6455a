// `nekton eval logprobs` against the independent PyTorch reference
// (tests/ckpt/hf_reference.py logprobs, float64): a Hugging Face Llama and
// GPT-2 model written by the reference, imported, and scored on a text. Each
// token's log-probability within 1e-4 (the f32 forward's rounding of logits
// of size ~1 is ~1e-6; the HF import tests hold logits to 1e-5 relative) and
// the same top-K ids at every position. With windows, the per-token scores
// sum to `eval perplexity`'s mean loss.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "hf_test_util.h"

namespace nk {
namespace {

using namespace nk::test;
using nlohmann::json;

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

void check_against_reference(const std::string& arch, json spec) {
  SCOPED_TRACE(arch);
  TempDir tmp("nk_eval_lp");
  spec["vocab"] = 257;  // the bytes tokenizer's
  spec["ctx"] = 64;
  const std::string hf = write_hf(tmp, arch, spec);
  RunResult r = run_nekton("import hf " + hf + " " + (tmp / "nk"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string text = "The quick brown fox jumps over the lazy dog; 0123 {}!";
  write_file(tmp / "text.txt", text);
  const int K = 5;
  r = run_nekton("eval logprobs eval.model=" + (tmp / "nk") + " eval.text=" + (tmp / "text.txt") +
                 " eval.tokenizer=bytes eval.format=jsonl eval.top_k=" + std::to_string(K) +
                 " eval.output=" + (tmp / "lp.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<json> ours = read_jsonl(tmp / "lp.jsonl");

  json ids = json::array();
  for (unsigned char c : text) ids.push_back(int(c));
  write_file(tmp / "ids.json", ids.dump());
  r = run_command(
      kReference + " logprobs " + hf + " " + (tmp / "ids.json") + " " + std::to_string(K),
      /*merge_stderr=*/false);
  ASSERT_EQ(r.code, 0) << r.out;
  const json ref = json::parse(r.out);

  ASSERT_EQ(ours.size(), text.size() - 1);
  ASSERT_EQ(ref.size(), text.size() - 1);
  double worst = 0;
  for (size_t t = 1; t < text.size(); ++t) {
    const json& o = ours[t - 1];
    const json& w = ref[t - 1];
    SCOPED_TRACE(::testing::Message() << "position " << t);
    EXPECT_EQ(o["position"].get<int64_t>(), int64_t(t));
    EXPECT_EQ(o["id"].get<int>(), int(static_cast<unsigned char>(text[t])));
    EXPECT_EQ(o["token"].get<std::string>(), text.substr(t, 1));
    worst = std::max(worst, std::fabs(o["logprob"].get<double>() - w["logprob"].get<double>()));
    ASSERT_EQ(o["top_logprobs"].size(), size_t(K));
    for (int j = 0; j < K; ++j) {
      EXPECT_EQ(o["top_logprobs"][j]["id"].get<int>(), w["top"][j].get<int>()) << "rank " << j;
      worst = std::max(worst, std::fabs(o["top_logprobs"][j]["logprob"].get<double>() -
                                        w["top_logprobs"][j].get<double>()));
    }
  }
  EXPECT_LE(worst, 1e-4);

  // Windows of 16 every 8 tokens: the same windows as perplexity, whose mean
  // loss is minus the mean of these log-probabilities.
  const std::string windows = " eval.window=16 eval.stride=8";
  r = run_nekton("eval logprobs eval.model=" + (tmp / "nk") + " eval.text=" + (tmp / "text.txt") +
                 " eval.tokenizer=bytes eval.format=jsonl eval.output=" + (tmp / "w.jsonl") +
                 windows);
  ASSERT_EQ(r.code, 0) << r.out;
  double sum = 0;
  const std::vector<json> scored = read_jsonl(tmp / "w.jsonl");
  for (const json& o : scored) sum += o["logprob"].get<double>();
  r = run_nekton("eval perplexity eval.model=" + (tmp / "nk") + " eval.text=" + (tmp / "text.txt") +
                 " eval.tokenizer=bytes eval.output=" + (tmp / "p.json") + windows);
  ASSERT_EQ(r.code, 0) << r.out;
  const json p = read_json(tmp / "p.json");
  EXPECT_EQ(p["tokens_scored"].get<size_t>(), scored.size());
  EXPECT_NEAR(-sum / double(scored.size()), p["mean_loss"].get<double>(), 1e-5);

  // generate.logprobs at each greedy step: the reference's top-K of the
  // prompt and the tokens generated so far.
  const std::string prompt = text.substr(0, 8);
  r = run_nekton("generate generate.model=" + (tmp / "nk") + " generate.prompt='" + prompt +
                     "' generate.tokenizer=bytes generate.temperature=0 generate.max_tokens=6 "
                     "generate.ignore_eos=true generate.format=jsonl generate.logprobs=" +
                     std::to_string(K),
                 /*merge_stderr=*/false);
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<json> steps;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) steps.push_back(json::parse(line));
  ASSERT_EQ(steps.size(), 6u);
  json seq = json::array();
  for (unsigned char c : prompt) seq.push_back(int(c));
  for (const json& st : steps) seq.push_back(st["id"]);
  write_file(tmp / "seq.json", seq.dump());
  r = run_command(
      kReference + " logprobs " + hf + " " + (tmp / "seq.json") + " " + std::to_string(K),
      /*merge_stderr=*/false);
  ASSERT_EQ(r.code, 0) << r.out;
  const json gref = json::parse(r.out);
  for (size_t s = 0; s < steps.size(); ++s) {
    SCOPED_TRACE(::testing::Message() << "step " << s);
    const json& w = gref[prompt.size() + s - 1];  // predicts seq[prompt.size() + s]
    EXPECT_EQ(steps[s]["id"].get<int>(), w["top"][0].get<int>());  // greedy
    EXPECT_NEAR(steps[s]["logprob"].get<double>(), w["logprob"].get<double>(), 1e-4);
    for (int j = 0; j < K; ++j) {
      EXPECT_EQ(steps[s]["top_logprobs"][j]["id"].get<int>(), w["top"][j].get<int>());
      EXPECT_NEAR(steps[s]["top_logprobs"][j]["logprob"].get<double>(),
                  w["top_logprobs"][j].get<double>(), 1e-4);
    }
  }
}

TEST(EvalLogprobs, LlamaMatchesTheReference) {
  check_against_reference("llama", llama_spec());
}

TEST(EvalLogprobs, Gpt2MatchesTheReference) {
  check_against_reference("gpt2", gpt2_spec());
}

TEST(EvalLogprobs, BadSettingsNameTheKey) {
  TempDir tmp("nk_eval_lp");
  const std::string hf = write_hf(tmp, "llama", llama_spec());
  ASSERT_EQ(run_nekton("import hf " + hf + " " + (tmp / "nk")).code, 0);
  write_file(tmp / "text.txt", "\x01\x02\x03");
  const std::string base =
      "eval logprobs eval.model=" + (tmp / "nk") + " eval.text=" + (tmp / "text.txt") + " ";
  RunResult r = run_nekton(base + "eval.format=xml");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "eval.format: must be text or jsonl, got 'xml'")) << r.out;
  r = run_nekton(base + "eval.top_k=21 eval.tokenizer=bytes");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "eval.top_k: 21 must be in [0, 20]")) << r.out;
  r = run_nekton("generate generate.model=" + (tmp / "nk") +
                 " generate.tokenizer=bytes generate.format=jsonl");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "generate.format: jsonl lists the tokens")) << r.out;
  r = run_nekton("generate generate.model=" + (tmp / "nk") +
                 " generate.tokenizer=bytes generate.logprobs=21");
  EXPECT_TRUE(contains(r.out, "generate.logprobs: must be in [-1, 20], got 21")) << r.out;
  r = run_nekton("eval logprobs eval.model=" + (tmp / "nk") + " eval.text=" + (tmp / "text.txt") +
                 " eval.output=" + (tmp / "never.jsonl") + " eval.tokenizer=bytes eval.top_k=-1");
  EXPECT_NE(r.code, 0);
  EXPECT_FALSE(fs::exists(tmp / "never.jsonl"));
}

}  // namespace
}  // namespace nk
