// Training the DeepSeek architectures (Multi-head Latent Attention with
// DeepSeekMoE): `nekton train` lowers the loss of deepseek_v2-tiny (one
// query projection, softmax routing) and deepseek_v3-tiny (the query
// bottleneck, sigmoid group-limited routing with aux-loss-free balancing)
// in f32 and bf16; resume is exact; full activation recompute gives the
// same weights.
#include <gtest/gtest.h>

#include <cstring>

#include "test_util.h"
#include "train/trainer.h"

namespace nk {
namespace {

using test::TempDir;

std::string mla_corpus(const TempDir& dir) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += "Line " + std::to_string(i * 7919 % 1000) + " of text.\n";
  test::write_file(dir / "c.txt", text);
  return dir / "c.txt";
}

std::vector<std::string> mla_keys(const TempDir& dir, const std::string& preset,
                                  std::vector<std::string> extra) {
  std::vector<std::string> ov = {"model.preset=" + preset, "data.path=" + mla_corpus(dir),
                                 "train.micro_batch=2",    "train.seq_len=32",
                                 "train.global_batch=4",   "train.steps=12",
                                 "train.lr=3e-3",          "train.min_lr=3e-4",
                                 "train.warmup_steps=3",   "train.val_every=6",
                                 "train.val_batches=1",    "train.log_every=1000",
                                 "train.peak_tflops=1"};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return ov;
}

struct MlaRun {
  std::vector<StepStats> history;
  std::vector<float> params;
};

MlaRun mla_run(const std::vector<std::string>& ov) {
  Trainer t(train_config_from(Config::load(train_schema(), "", ov)));
  t.run({});
  MlaRun r{t.history(), std::vector<float>(size_t(t.model().params().numel()))};
  std::memcpy(r.params.data(), t.model().params().raw(), r.params.size() * sizeof(float));
  return r;
}

class DeepseekTrain : public ::testing::TestWithParam<const char*> {};

TEST_P(DeepseekTrain, LossFallsResumeIsExactRecomputeChangesNothing) {
  for (const char* dtype : {"f32", "bf16"}) {
    SCOPED_TRACE(dtype);
    TempDir dir("nk_deepseek_train");
    const std::string dt = std::string("train.dtype=") + dtype;
    MlaRun straight =
        mla_run(mla_keys(dir, GetParam(), {dt, "train.out_dir=" + (dir / "straight")}));
    ASSERT_EQ(straight.history.size(), 12u);
    for (const StepStats& s : straight.history) EXPECT_TRUE(std::isfinite(s.loss));
    std::cout << "[ " << GetParam() << " " << dtype << " ] loss " << straight.history.front().loss
              << " -> " << straight.history.back().loss << "\n";
    EXPECT_LT(straight.history.back().loss, straight.history.front().loss);
    std::vector<std::string> split =
        mla_keys(dir, GetParam(), {dt, "train.out_dir=" + (dir / "s")});
    std::vector<std::string> head_keys = split;
    head_keys.push_back("train.exit_at_step=5");
    MlaRun head = mla_run(head_keys);
    MlaRun tail = mla_run(split);
    std::vector<StepStats> joined = head.history;
    joined.insert(joined.end(), tail.history.begin(), tail.history.end());
    ASSERT_EQ(joined.size(), straight.history.size());
    for (size_t i = 0; i < joined.size(); ++i)
      EXPECT_EQ(joined[i].loss, straight.history[i].loss) << "step " << i + 1;
    EXPECT_TRUE(tail.params == straight.params);
    MlaRun full = mla_run(
        mla_keys(dir, GetParam(), {dt, "train.out_dir=" + (dir / "full"), "train.recompute=full"}));
    EXPECT_TRUE(full.params == straight.params);
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, DeepseekTrain,
                         ::testing::Values("deepseek_v2-tiny", "deepseek_v3-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace nk
