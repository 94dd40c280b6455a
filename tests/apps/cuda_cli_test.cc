// `generate.device` and `eval.device`: a random GPT-2 and Llama (f32) saved
// to a folder, run on cuda and on the CPU through the command line, give the
// same greedy tokens and per-token log-probabilities within 1e-4 (fp32 sums
// in another order: ~1e-6 relative). Without a GPU those cases are skipped,
// and asking for cuda is an error naming the key; on a GPU, cuda with a
// quantised model is refused naming the key.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sstream>

#include "ckpt/model_io.h"
#include "data/tokenizer/tokenizer.h"
#include "model/tiny_config.h"
#include "model/transformer.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::run_nekton;

std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') v.push_back(nlohmann::json::parse(line));
  return v;
}

class CudaCli : public ::testing::Test {
 protected:
  std::string save(bool llama) {
    const std::string dir = d_ / (llama ? "llama" : "gpt2");
    Transformer m(test::tiny_config(llama, 256, 64), DType::F32, 7);
    save_model(dir, m);
    store_tokenizer("bytes", dir);
    return dir;
  }
  test::TempDir d_{"nk_cuda_cli"};
};

TEST_F(CudaCli, GenerateAndEvalMatchTheCpu) {
  if (!device_available(Device::CUDA))
    GTEST_SKIP() << "cuda not run: " << why_unavailable(Device::CUDA);
  const std::string text = d_ / "text.txt";
  test::write_file(text, "The quick brown fox jumps over the lazy dog, twice.");
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt2");
    const std::string model = save(llama);
    std::vector<nlohmann::json> gen[2], ev[2];
    int i = 0;
    for (const char* dev : {"cpu", "cuda"}) {
      auto g = run_nekton("generate generate.model=" + model +
                              " generate.prompt=Hello generate.temperature=0 generate.max_tokens=12"
                              " generate.ignore_eos=true generate.logprobs=3 generate.format=jsonl"
                              " generate.device=" +
                              dev,
                          false);
      ASSERT_EQ(g.code, 0) << g.out;
      gen[i] = json_lines(g.out);
      auto e = run_nekton("eval logprobs eval.model=" + model + " eval.text=" + text +
                              " eval.top_k=2 eval.format=jsonl eval.device=" + dev,
                          false);
      ASSERT_EQ(e.code, 0) << e.out;
      ev[i++] = json_lines(e.out);
    }
    ASSERT_EQ(gen[0].size(), 12u);
    ASSERT_EQ(gen[1].size(), gen[0].size());
    for (size_t t = 0; t < gen[0].size(); ++t) {
      EXPECT_EQ(gen[1][t]["id"], gen[0][t]["id"]) << "token " << t;
      EXPECT_NEAR(gen[1][t]["logprob"].get<double>(), gen[0][t]["logprob"].get<double>(), 1e-4);
    }
    ASSERT_GT(ev[0].size(), 10u);
    ASSERT_EQ(ev[1].size(), ev[0].size());
    for (size_t t = 0; t < ev[0].size(); ++t) {
      EXPECT_EQ(ev[1][t]["id"], ev[0][t]["id"]) << "position " << t;
      EXPECT_NEAR(ev[1][t]["logprob"].get<double>(), ev[0][t]["logprob"].get<double>(), 1e-4);
    }
  }
}

TEST_F(CudaCli, CudaIsRefusedNamingTheKey) {
  const std::string model = save(false);
  if (!device_available(Device::CUDA)) {
    auto r = run_nekton("generate generate.model=" + model + " generate.device=cuda");
    EXPECT_NE(r.code, 0);
    EXPECT_TRUE(contains(r.out, "generate.device: device 'cuda' is not available")) << r.out;
    r = run_nekton("eval logprobs eval.model=" + model + " eval.text=" + model +
                   "/config.json eval.device=cuda");
    EXPECT_NE(r.code, 0);
    EXPECT_TRUE(contains(r.out, "eval.device: device 'cuda' is not available")) << r.out;
    return;
  }
  auto r = run_nekton("generate generate.model=" + model +
                      " generate.quantize=q8_0 generate.device=cuda generate.max_tokens=2");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "generate.device: quantised weights run on the CPU only")) << r.out;
}

}  // namespace
}  // namespace nk
