// `nekton finetune`: a model learns a synthetic instruction task (reversing
// words) from prompt/answer records, greedy answers checked before and after;
// --show-sample shows what the loss covers; a stopped run resumes to the same
// weights as an unbroken one; bad settings and records are clear errors.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/model_io.h"
#include "core/rng.h"
#include "data/tokenizer/tokenizer.h"
#include "model/transformer.h"
#include "test_util.h"

namespace nk {
namespace {

using json = nlohmann::json;
using test::contains;
namespace fs = std::filesystem;

class Finetune : public ::testing::Test {
 protected:
  void SetUp() override {
    // A randomly initialised GPT-2-style model over bytes, saved as a model folder.
    ModelConfig c;
    c.arch = "gpt2";
    c.vocab_size = 257;
    c.max_seq_len = 64;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 4;
    c.d_model = 128;
    c.d_ff = 512;
    Transformer m(c, DType::F32, 7);
    save_model(base_, m);
    store_tokenizer("bytes", base_);
    Rng rng(11);
    for (int i = 0; i < 40; ++i) {
      std::string w;
      for (int k = 0; k < 4; ++k) w += char('a' + rng.below(26));
      words_.push_back(w);
    }
    std::ofstream f(data_);
    for (int e = 0; e < 10; ++e)
      for (const std::string& w : words_)
        f << json{{"input", fmt::format("reverse {}:", w)},
                  {"output", fmt::format(" {}", reversed(w))}}
                 .dump()
          << "\n";
  }
  static std::string reversed(std::string w) { return {w.rbegin(), w.rend()}; }
  // Greedy answers of the model in `dir` to every word; how many are right.
  int correct_answers(const std::string& dir) {
    const std::string prompts = d_ / "prompts.jsonl";
    {
      std::ofstream f(prompts);
      for (const std::string& w : words_)
        f << json{{"prompt", "reverse " + w + ":"}}.dump() << "\n";
    }
    auto r =
        test::run_nekton("generate generate.model=" + dir + " generate.prompt_file=" + prompts +
                         " generate.temperature=0 generate.max_tokens=6");
    EXPECT_EQ(r.code, 0) << r.out;
    last_answers_ = r.out;
    int right = 0;
    for (const std::string& w : words_)
      right += contains(r.out, "reverse " + w + ": " + reversed(w) + "\n");
    return right;
  }
  std::string finetune_args(const std::string& out) const {
    return "finetune train.init_from=" + base_ + " data.sft_path=" + data_ +
           " data.chat_template=plain data.pack=true train.seq_len=64 train.micro_batch=8 "
           "train.global_batch=8 train.dtype=f32 train.lr=3e-3 train.warmup_steps=5 "
           "train.val_every=0 train.peak_tflops=1 train.out_dir=" +
           out;
  }
  test::TempDir d_{"nk_finetune"};
  const std::string base_ = d_ / "base", data_ = d_ / "reverse.jsonl";
  std::vector<std::string> words_;
  std::string last_answers_;  // generate's output in correct_answers
};

// From (near) none right to most right under greedy decoding.
TEST_F(Finetune, LearnsToReverseWords) {
  const int before = correct_answers(base_);
  const std::string out = d_ / "run";
  auto r = test::run_nekton(finetune_args(out) + " train.steps=120");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "chat template plain; " + data_ + ": 400 samples")) << r.out;
  EXPECT_TRUE(contains(r.out, "starting from the weights of " + base_)) << r.out;
  const int after = correct_answers(out + "/model");
  EXPECT_LE(before, 2);
  EXPECT_GE(after, 30) << "of " << words_.size() << ":\n" << last_answers_ << "\n" << r.out;
}

TEST_F(Finetune, ShowSampleMarksTheTrainedTokens) {
  auto r = test::run_nekton(finetune_args(d_ / "x") + " --show-sample 2");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string& w = words_[2];
  EXPECT_TRUE(contains(r.out, "chat template plain")) << r.out;
  EXPECT_TRUE(contains(r.out, "reverse " + w + ":[[ " + reversed(w))) << r.out;
  EXPECT_FALSE(fs::exists(d_ / "x")) << "--show-sample writes nothing";
  r = test::run_nekton(finetune_args(d_ / "x") + " --show-sample 400");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "holds 400 samples")) << r.out;
}

// Stopped after step 3 and rerun: the same weights as 6 steps in one go.
TEST_F(Finetune, ResumesExactly) {
  const std::string a = d_ / "a", b = d_ / "b";
  auto r = test::run_nekton(finetune_args(a) + " train.steps=6");
  ASSERT_EQ(r.code, 0) << r.out;
  r = test::run_nekton(finetune_args(b) + " train.steps=6 train.exit_at_step=3");
  ASSERT_EQ(r.code, 0) << r.out;
  r = test::run_nekton(finetune_args(b) + " train.steps=6");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "resuming from checkpoint")) << r.out;
  EXPECT_EQ(test::read_file(a + "/model/model.safetensors"),
            test::read_file(b + "/model/model.safetensors"));
}

TEST_F(Finetune, BadSettingsAndRecordsAreClearErrors) {
  const std::string out = d_ / "bad";
  auto expect_error = [&](const std::string& args, const std::string& message) {
    auto r = test::run_nekton(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, message)) << args << "\n" << r.out;
    EXPECT_FALSE(fs::exists(out + "/model")) << args;
  };
  expect_error("finetune train.init_from=" + base_ + " train.out_dir=" + out,
               "data.path: no training data given");
  expect_error(finetune_args(out) + " data.chat_template=vicuna",
               "unknown chat template 'vicuna' (known: chatml, llama3");
  expect_error(finetune_args(out) + " data.chat_template=auto",
               "tokenizer_config.json does not exist");
  expect_error(finetune_args(out) + " data.loss_on=prompt",
               "data.loss_on: expected assistant or all, got 'prompt'");
  expect_error(finetune_args(out) + " data.path=" + data_,
               "give only one of data.path, data.prefix, data.blend and data.sft_path");
  expect_error("train --show-sample 1 data.path=" + data_,
               "--show-sample is an option of nekton finetune only");
  const std::string no_answer = d_ / "no_answer.jsonl";
  test::write_file(no_answer, R"({"input": "q", "output": "a"})"
                              "\n"
                              R"({"messages": [{"role": "user", "content": "only a question"}]})"
                              "\n");
  expect_error(finetune_args(out) + " data.sft_path=" + no_answer,
               no_answer + ":2: the conversation has no assistant message");
  // Gemma's template has no system role: refused with the record's line.
  const std::string with_system = d_ / "system.jsonl";
  test::write_file(with_system, R"({"system": "s", "input": "q", "output": "a"})"
                                "\n");
  expect_error(finetune_args(out) + " data.chat_template=gemma data.sft_path=" + with_system,
               with_system + ":1: chat template gemma: the system role is not supported");
}

}  // namespace
}  // namespace nk
