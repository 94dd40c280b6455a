// Training the Gemma architectures (gemma2-tiny: soft-capped scores and
// logits, alternating local and global layers; gemma3-tiny: q/k norms, five
// local layers then a global one with their own RoPE bases): `nekton train`
// lowers the loss over rows longer than the window in f32 and bf16, resume is
// exact, activation recompute changes nothing, and the model keys that cannot
// hold are refused naming the key.
#include <gtest/gtest.h>

#include <cstring>

#include "test_util.h"
#include "train/trainer.h"

namespace nk {
namespace {

using test::contains;
using test::error_of;
using test::TempDir;

std::string corpus(const TempDir& dir) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += "Line " + std::to_string(i * 7919 % 1000) + " of text.\n";
  test::write_file(dir / "c.txt", text);
  return dir / "c.txt";
}

// Rows of 40 tokens under a window of 16.
std::vector<std::string> keys(const TempDir& dir, const std::string& preset,
                              std::vector<std::string> extra) {
  std::vector<std::string> ov = {
      "model.preset=" + preset,  "data.path=" + corpus(dir), "train.micro_batch=2",
      "train.seq_len=40",        "train.global_batch=4",     "train.steps=12",
      "train.lr=3e-3",           "train.min_lr=3e-4",        "train.warmup_steps=3",
      "train.val_every=6",       "train.val_batches=1",      "train.log_every=1000",
      "model.sliding_window=16", "train.peak_tflops=1"};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return ov;
}

struct TrainRun {
  std::vector<StepStats> history;
  std::vector<float> params;
};

TrainRun run(const std::vector<std::string>& ov) {
  Trainer t(train_config_from(Config::load(train_schema(), "", ov)));
  t.run({});
  TrainRun r{t.history(), std::vector<float>(size_t(t.model().params().numel()))};
  std::memcpy(r.params.data(), t.model().params().raw(), r.params.size() * sizeof(float));
  return r;
}

class GemmaTrain : public ::testing::TestWithParam<const char*> {};

// The loss goes down in f32 and bf16; resume (split at step 5) continues the
// straight run bit for bit.
TEST_P(GemmaTrain, LossFallsAndResumeIsExact) {
  for (const char* dtype : {"f32", "bf16"}) {
    SCOPED_TRACE(dtype);
    TempDir dir("nk_gemma_train");
    const std::string dt = std::string("train.dtype=") + dtype;
    TrainRun straight = run(keys(dir, GetParam(), {dt, "train.out_dir=" + (dir / "straight")}));
    ASSERT_EQ(straight.history.size(), 12u);
    for (const StepStats& s : straight.history) EXPECT_TRUE(std::isfinite(s.loss));
    std::cout << "[ " << GetParam() << " " << dtype << " ] loss " << straight.history.front().loss
              << " -> " << straight.history.back().loss << "\n";
    EXPECT_LT(straight.history.back().loss, straight.history.front().loss);
    std::vector<std::string> split = keys(dir, GetParam(), {dt, "train.out_dir=" + (dir / "s")});
    std::vector<std::string> head_keys = split;
    head_keys.push_back("train.exit_at_step=5");
    TrainRun head = run(head_keys);
    TrainRun tail = run(split);
    std::vector<StepStats> joined = head.history;
    joined.insert(joined.end(), tail.history.begin(), tail.history.end());
    ASSERT_EQ(joined.size(), straight.history.size());
    for (size_t i = 0; i < joined.size(); ++i)
      EXPECT_EQ(joined[i].loss, straight.history[i].loss) << "step " << i + 1;
    EXPECT_TRUE(tail.params == straight.params);
  }
}

// Recomputing the layers (full or selective: the post norms' inputs are
// kept, their outputs recomputed) gives the same bits.
TEST_P(GemmaTrain, RecomputeGivesTheSameBits) {
  TempDir dir("nk_gemma_recompute");
  TrainRun plain = run(keys(dir, GetParam(), {"train.steps=3", "train.out_dir=" + (dir / "a")}));
  for (const char* policy : {"full", "selective"}) {
    TrainRun r = run(keys(dir, GetParam(),
                          {"train.steps=3", std::string("train.recompute=") + policy,
                           "train.out_dir=" + (dir / policy)}));
    ASSERT_EQ(r.history.size(), plain.history.size());
    for (size_t i = 0; i < r.history.size(); ++i)
      EXPECT_EQ(r.history[i].loss, plain.history[i].loss) << policy << " step " << i + 1;
    EXPECT_TRUE(r.params == plain.params) << policy;
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, GemmaTrain, ::testing::Values("gemma2-tiny", "gemma3-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

TEST(GemmaTrainRefusals, NameTheKey) {
  TempDir dir("nk_gemma_refuse");
  auto err = [&](const std::string& preset, std::vector<std::string> extra) {
    return error_of([&] {
      Trainer t(train_config_from(Config::load(train_schema(), "", keys(dir, preset, extra))));
    });
  };
  std::string e = err("gemma2-tiny", {"model.final_logit_softcap=-2"});
  EXPECT_TRUE(contains(e, "model.final_logit_softcap")) << e;
  e = err("gemma3-tiny", {"model.sliding_window=0"});
  EXPECT_TRUE(contains(e, "model.sliding_window_pattern")) << e;
  e = err("gpt-tiny", {"model.rope_local_theta=100"});  // learned positions: no RoPE
  EXPECT_TRUE(contains(e, "model.rope_local_theta")) << e;
  // Post norms under tensor parallelism: refused before anything is built.
  e = error_of([&] { check_tensor_parallel(model_preset("gemma2-tiny"), 2); });
  EXPECT_TRUE(contains(e, "parallel.tp = 2")) << e;
}

}  // namespace
}  // namespace nk
