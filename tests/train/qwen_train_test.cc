// Training the Qwen architectures (qwen3-tiny: q/k norms and heads of their
// own size; qwen2-moe-tiny: experts plus a gated shared expert;
// qwen3-moe-tiny: q/k norms and experts): `nekton train` lowers the loss,
// resume is exact (losses, gradient norms and weights bit for bit, f32 and
// bf16), activation recompute changes nothing, and what they cannot do yet
// is refused naming its key.
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

std::vector<std::string> keys(const TempDir& dir, const std::string& preset,
                              std::vector<std::string> extra) {
  std::vector<std::string> ov = {
      "model.preset=" + preset, "data.path=" + corpus(dir), "train.micro_batch=2",
      "train.seq_len=16",       "train.global_batch=4",     "train.steps=16",
      "train.lr=3e-3",          "train.min_lr=3e-4",        "train.warmup_steps=4",
      "train.val_every=8",      "train.val_batches=1",      "train.log_every=1000",
      "train.peak_tflops=1"};
  if (preset != "qwen3-tiny") ov.push_back("model.moe_z_loss_coeff=0.001");
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

class QwenTrain : public ::testing::TestWithParam<const char*> {};

// Resume (split at step 7) continues the straight run bit for bit, in f32
// and bf16, and the loss goes down.
TEST_P(QwenTrain, ResumeIsExact) {
  for (const char* dtype : {"f32", "bf16"}) {
    SCOPED_TRACE(dtype);
    TempDir dir("nk_qwen_resume");
    const std::string dt = std::string("train.dtype=") + dtype;
    TrainRun straight = run(keys(dir, GetParam(), {dt, "train.out_dir=" + (dir / "straight")}));
    ASSERT_EQ(straight.history.size(), 16u);
    EXPECT_LT(straight.history.back().loss, straight.history.front().loss);
    std::vector<std::string> split = keys(dir, GetParam(), {dt, "train.out_dir=" + (dir / "s")});
    std::vector<std::string> head_keys = split;
    head_keys.push_back("train.exit_at_step=7");
    TrainRun head = run(head_keys);
    ASSERT_EQ(head.history.size(), 7u);
    TrainRun tail = run(split);
    std::vector<StepStats> joined = head.history;
    joined.insert(joined.end(), tail.history.begin(), tail.history.end());
    ASSERT_EQ(joined.size(), straight.history.size());
    for (size_t i = 0; i < joined.size(); ++i) {
      EXPECT_EQ(joined[i].loss, straight.history[i].loss) << "step " << i + 1;
      EXPECT_EQ(joined[i].grad_norm, straight.history[i].grad_norm) << "step " << i + 1;
    }
    EXPECT_TRUE(tail.params == straight.params);
  }
}

// Recomputing the layers (full or selective) gives the same bits.
TEST_P(QwenTrain, RecomputeGivesTheSameBits) {
  TempDir dir("nk_qwen_recompute");
  TrainRun plain = run(keys(dir, GetParam(), {"train.steps=4", "train.out_dir=" + (dir / "a")}));
  for (const char* policy : {"full", "selective"}) {
    TrainRun r = run(keys(dir, GetParam(),
                          {"train.steps=4", std::string("train.recompute=") + policy,
                           "train.out_dir=" + (dir / policy)}));
    ASSERT_EQ(r.history.size(), plain.history.size());
    for (size_t i = 0; i < r.history.size(); ++i)
      EXPECT_EQ(r.history[i].loss, plain.history[i].loss) << policy << " step " << i + 1;
    EXPECT_TRUE(r.params == plain.params) << policy;
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, QwenTrain,
                         ::testing::Values("qwen3-tiny", "qwen2-moe-tiny", "qwen3-moe-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

TEST(QwenTrainRefusals, NameTheKey) {
  TempDir dir("nk_qwen_refuse");
  auto err = [&](const std::string& preset, std::vector<std::string> extra) {
    return error_of([&] {
      Trainer t(train_config_from(Config::load(train_schema(), "", keys(dir, preset, extra))));
    });
  };
  std::string e = err("qwen3-moe-tiny", {"model.moe_shared_d_ff=32"});
  EXPECT_TRUE(contains(e, "model.moe_shared_d_ff")) << e;
  e = err("qwen2-moe-tiny", {"model.moe_shared_expert_gate=false"});
  EXPECT_TRUE(contains(e, "model.moe_shared_d_ff")) << e;
  e = err("mixtral-tiny", {"model.moe_shared_d_ff=32"});
  EXPECT_TRUE(contains(e, "model.moe_shared_d_ff")) << e;
  e = err("qwen3-tiny", {"model.head_dim=-3"});
  EXPECT_TRUE(contains(e, "model.head_dim")) << e;
  // q/k norms under tensor parallelism train (tests/apps/mpi/moe_tp_ranks.sh);
  // heads that tp does not divide are refused before anything is built.
  ModelConfig odd = model_preset("qwen3-tiny");
  odd.n_kv_head = 1;
  e = error_of([&] { check_tensor_parallel(odd, 2); });
  EXPECT_TRUE(contains(e, "model.n_kv_head = 1")) << e;
}

}  // namespace
}  // namespace nk
