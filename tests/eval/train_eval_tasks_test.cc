// train.eval_tasks: benchmark tasks during `nekton train` (one process and
// two data-parallel ones): the steps train.eval_tasks_every names (and the
// last) log eval/TASK/METRIC in metrics.jsonl and the step line, and each
// value equals `nekton eval tasks` on the checkpoint saved at that step.
// Bad settings stop the run before its first step, naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "test_util.h"

namespace nk {
namespace {

using Json = nlohmann::json;
using test::contains;
using test::run_nekton;

class TrainEvalTasks : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = d_.fresh("data").string();
    std::mt19937 rng(5);
    const char* kWords[] = {"the", "cat", "sat", "on", "a", "mat", "dog", "ran"};
    auto words = [&](int n) {
      std::string s;
      for (int i = 0; i < n; ++i) s += std::string(i ? " " : "") + kWords[rng() % 8];
      return s;
    };
    std::string hs, lam;
    for (int i = 0; i < 8; ++i) {
      Json choices = Json::array();
      for (int k = 0; k < 4; ++k) choices.push_back(words(1 + int(rng() % 3)));
      hs += Json{{"query", words(6)}, {"choices", choices}, {"label", std::to_string(rng() % 4)}}
                .dump() +
            "\n";
      lam += Json{{"text", words(7)}}.dump() + "\n";
    }
    std::filesystem::create_directories(data_ + "/hellaswag");
    std::filesystem::create_directories(data_ + "/lambada_openai");
    test::write_file(data_ + "/hellaswag/validation.jsonl", hs);
    test::write_file(data_ + "/lambada_openai/test.jsonl", lam);
    std::string text;
    for (int i = 0; i < 300; ++i) text += "All work and no play makes a dull model. ";
    corpus_ = d_ / "c.txt";
    test::write_file(corpus_, text);
  }
  std::string train_args(const std::string& out, int global_batch = 2) {
    return "model.preset=gpt-tiny model.n_layer=1 model.d_model=32 model.n_head=2 "
           "model.d_ff=64 train.micro_batch=2 train.seq_len=16 train.global_batch=" +
           std::to_string(global_batch) +
           " train.steps=5 train.val_every=0 train.peak_tflops=1 train.dtype=f32 "
           "train.save_every=1 train.keep_checkpoints=10 data.path=" +
           corpus_ + " train.out_dir=" + out +
           " train.eval_tasks=hellaswag,lambada_openai train.eval_tasks_every=2 "
           "train.eval_data=" +
           data_;
  }
  // The run's records with eval figures against eval tasks on its checkpoints.
  void expect_checkpoints_agree(const std::string& out, const std::string& log) {
    std::istringstream in(test::read_file(out + "/metrics.jsonl"));
    std::vector<int64_t> steps;
    for (std::string line; std::getline(in, line);) {
      const Json rec = Json::parse(line);
      const int64_t step = rec["step"];
      if (!rec.contains("eval/hellaswag/acc")) continue;
      steps.push_back(step);
      const std::string ckpt = out + fmt::format("/checkpoints/step_{:08d}", step);
      const std::string res = out + fmt::format("/eval_{}.json", step);
      auto r = run_nekton("eval tasks eval.model=" + ckpt +
                          " eval.tokenizer=bytes eval.tasks=hellaswag,lambada_openai eval.data=" +
                          data_ + " eval.output=" + res);
      ASSERT_EQ(r.code, 0) << r.out;
      const Json got = Json::parse(test::read_file(res))["results"];
      SCOPED_TRACE(step);
      EXPECT_EQ(rec["eval/hellaswag/acc"], got["hellaswag"]["acc,none"]);
      EXPECT_EQ(rec["eval/hellaswag/acc_norm"], got["hellaswag"]["acc_norm,none"]);
      EXPECT_EQ(rec["eval/lambada_openai/acc"], got["lambada_openai"]["acc,none"]);
      const double a = rec["eval/lambada_openai/perplexity"],
                   b = got["lambada_openai"]["perplexity,none"];
      EXPECT_NEAR(std::log(a), std::log(b), 1e-9);
    }
    EXPECT_EQ(steps, (std::vector<int64_t>{2, 4, 5}));
    EXPECT_TRUE(contains(log, "| eval/hellaswag/acc ") &&
                contains(log, "| eval/lambada_openai/perplexity "))
        << log;
  }
  test::TempDir d_{"nk_traineval"};
  std::string data_, corpus_;
};

TEST_F(TrainEvalTasks, OneProcessLogsWhatEvalTasksGivesOnTheCheckpoints) {
  const std::string out = d_ / "one";
  auto r = run_nekton("train " + train_args(out));
  ASSERT_EQ(r.code, 0) << r.out;
  expect_checkpoints_agree(out, r.out);
}

TEST_F(TrainEvalTasks, DataParallelRanksEvaluateWithoutHanging) {
  const std::string out = d_ / "dp2";
  auto r = run_nekton("train --nproc 2 " + train_args(out, 4));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "data parallel")) << r.out;
  expect_checkpoints_agree(out, r.out);
}

TEST_F(TrainEvalTasks, BadSettingsStopBeforeTraining) {
  const std::string out = d_ / "bad";
  auto r = run_nekton("train " + train_args(out) + " train.eval_tasks=no_such_task");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "train.eval_tasks: no task, group or tag 'no_such_task'")) << r.out;
  EXPECT_FALSE(std::filesystem::exists(out + "/metrics.jsonl"));
  r = run_nekton("train " + train_args(out) + " train.eval_data=");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "train.eval_data: train.eval_tasks needs")) << r.out;
  r = run_nekton("train " + train_args(out) + " train.eval_tasks_every=-1");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "train.eval_tasks_every: must be >= 0")) << r.out;
  // Under tensor parallelism no rank holds the whole model.
  r = run_nekton("train --nproc 2 " + train_args(out, 2) + " parallel.tp=2");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "train.eval_tasks: needs the whole model")) << r.out;
}

}  // namespace
}  // namespace nk
