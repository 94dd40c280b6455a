// `nekton align` end to end: DPO on a synthetic preference set made here
// (chosen completions are a fixed marker, rejected ones random letters)
// raises held-out reward accuracy above 0.9 and the exported model then
// generates the marker; a run stopped by SIGTERM and rerun ends with the same
// weights bit for bit as an uninterrupted one, reading its precomputed
// reference log-probabilities back instead of computing them again; bad data
// stops before anything is written; --help lists the align.* keys.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "align/marker_pairs.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::TempDir;
namespace fs = std::filesystem;

std::string align_args(const TempDir& dir, const std::string& out, int steps) {
  return fmt::format(
      "align model.preset=llama-tiny train.dtype=f32 train.seq_len=16 train.micro_batch=16 "
      "train.global_batch=16 train.steps={} train.lr=3e-3 train.min_lr=3e-4 "
      "train.warmup_steps=0 train.peak_tflops=1 train.threads=2 train.val_every={} "
      "train.val_batches=2 align.method=dpo align.beta=0.1 align.data_path={} "
      "align.valid_path={} train.out_dir={}",
      steps, steps, dir / "train.jsonl", dir / "valid.jsonl", out);
}

double last_value(const std::string& metrics, const std::string& key) {
  const std::string text = test::read_file(metrics);
  const size_t at = text.rfind("\"" + key + "\": ");
  if (at == std::string::npos) return NAN;
  return std::stod(text.substr(at + key.size() + 4));
}

TEST(AlignCli, DpoLearnsThePreferenceAndGeneratesTheMarker) {
  TempDir dir("nk_align");
  test::write_marker_pairs(dir / "train.jsonl", 256, 1);
  test::write_marker_pairs(dir / "valid.jsonl", 32, 2);
  const std::string out = dir / "run";
  const test::RunResult r = test::run_nekton(align_args(dir, out, 60));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "rewards/accuracies")) << r.out;
  EXPECT_TRUE(contains(r.out, "precomputing the reference log-probabilities of 576 sequences"))
      << r.out;
  const double acc = last_value(out + "/metrics.jsonl", "val_rewards/accuracies");
  EXPECT_GT(acc, 0.9) << r.out;
  EXPECT_GT(last_value(out + "/metrics.jsonl", "val_rewards/margins"), 0) << r.out;
  const test::RunResult g = test::run_nekton(
      "generate generate.model=" + out +
          "/model \"generate.prompt=say qrs:\" generate.max_tokens=6 generate.temperature=0",
      false);
  ASSERT_EQ(g.code, 0) << g.out;
  EXPECT_TRUE(contains(g.out, "say qrs: END")) << g.out;
}

TEST(AlignCli, SigtermAndRerunMatchAnUninterruptedRunBitForBit) {
  TempDir dir("nk_align_resume");
  test::write_marker_pairs(dir / "train.jsonl", 64, 3);
  test::write_marker_pairs(dir / "valid.jsonl", 8, 4);
  const int steps = 40;
  const std::string whole = dir / "whole", cut = dir / "cut";
  const test::RunResult w = test::run_nekton(align_args(dir, whole, steps));
  ASSERT_EQ(w.code, 0) << w.out;

  std::vector<std::string> args;
  {
    std::istringstream in(align_args(dir, cut, steps) + " train.save_every=1");
    for (std::string s; in >> s;) args.push_back(s);
  }
  const pid_t pid = test::spawn_nekton(args, dir / "cut.log");
  ASSERT_GT(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (test::logged_losses(cut + "/metrics.jsonl").size() < 5 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ::kill(pid, SIGTERM);
  int st = 0;
  ::waitpid(pid, &st, 0);
  const std::string log = test::read_file(dir / "cut.log");
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << log;
  ASSERT_TRUE(contains(log, "SIGTERM received")) << log;
  ASSERT_LT(test::logged_losses(cut + "/metrics.jsonl").size(), size_t(steps));
  const std::string ref = cut + "/reference_logps.json";
  const auto written = fs::last_write_time(ref);
  const std::string ref_bytes = test::read_file(ref);

  const test::RunResult again =
      test::run_nekton(align_args(dir, cut, steps) + " train.save_every=1");
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(contains(again.out, "resuming from checkpoint")) << again.out;
  EXPECT_TRUE(contains(again.out, "reusing the reference log-probabilities")) << again.out;
  EXPECT_FALSE(contains(again.out, "precomputing")) << again.out;
  EXPECT_EQ(fs::last_write_time(ref), written);
  EXPECT_EQ(test::read_file(ref), ref_bytes);
  EXPECT_EQ(test::read_file(cut + "/model/model.safetensors"),
            test::read_file(whole + "/model/model.safetensors"))
      << "final weights differ";
  EXPECT_EQ(test::logged_losses(cut + "/metrics.jsonl"),
            test::logged_losses(whole + "/metrics.jsonl"));
}

TEST(AlignCli, BadDataStopsBeforeWritingAnything) {
  TempDir dir("nk_align_bad");
  test::write_file(dir / "bad.jsonl", R"({"prompt": "a", "chosen": " x", "rejected": "y"})"
                                      "\n\n"
                                      R"({"prompt": "b", "rejected": "y"})"
                                      "\n");
  test::write_file(dir / "valid.jsonl", R"({"prompt": "a", "chosen": " x", "rejected": "y"})"
                                        "\n");
  const std::string out = dir / "run";
  const test::RunResult r = test::run_nekton(
      "align model.preset=llama-tiny train.seq_len=16 train.micro_batch=2 train.global_batch=2 "
      "align.data_path=" +
      (dir / "bad.jsonl") + " train.out_dir=" + out);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "bad.jsonl:3")) << r.out;
  EXPECT_TRUE(contains(r.out, "no \"chosen\"")) << r.out;
  EXPECT_FALSE(fs::exists(out));
  // An odd micro-batch cannot hold pairs.
  const test::RunResult odd = test::run_nekton(
      "align model.preset=llama-tiny train.seq_len=16 train.micro_batch=3 train.global_batch=3 "
      "align.data_path=" +
      (dir / "valid.jsonl") + " train.out_dir=" + out);
  EXPECT_NE(odd.code, 0);
  EXPECT_TRUE(contains(odd.out, "must be even")) << odd.out;
  EXPECT_FALSE(fs::exists(out));
}

TEST(AlignCli, HelpListsTheAlignKeys) {
  const test::RunResult r = test::run_nekton("align --help");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* key :
       {"align.method", "align.loss_type", "align.beta", "align.label_smoothing", "align.rpo_alpha",
        "align.simpo_gamma", "align.reference", "align.max_prompt_length", "peft.method",
        "train.init_from", "align.reward_funcs", "align.reward_weights",
        "align.reward_accuracy.extract", "align.reward_format.pattern",
        "align.reward_length.cache_tokens", "align.reward_command", "align.reward_url",
        "align.reward_timeout_s"})
    EXPECT_TRUE(contains(r.out, key)) << key;
}

}  // namespace
}  // namespace nk
