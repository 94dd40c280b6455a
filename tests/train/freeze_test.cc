// train.freeze: patterns resolve to parameter names (clear errors otherwise);
// a frozen run keeps the frozen weights, checkpoints moments for the trainable
// parameters only, resumes exactly, and refuses a resume with another freeze set.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "test_util.h"
#include "train/freeze.h"
#include "train/trainer.h"

namespace nk {
namespace {

using test::contains;
using test::error_of;
using test::TempDir;
namespace fs = std::filesystem;

TrainConfig tiny(const std::vector<std::string>& extra) {
  std::vector<std::string> ov = {
      "model.preset=gpt-tiny", "model.n_layer=2",     "model.d_model=64",
      "model.n_head=2",        "model.d_ff=128",      "model.vocab_size=300",
      "train.micro_batch=2",   "train.seq_len=16",    "train.global_batch=4",
      "train.steps=12",        "train.lr=3e-3",       "train.warmup_steps=2",
      "train.val_every=6",     "train.val_batches=1", "train.log_every=1000",
      "train.peak_tflops=1",   "train.grad_clip=0.5"};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return train_config_from(Config::load(train_schema(), "", ov));
}

std::vector<std::string> with(std::vector<std::string> keys, const std::vector<std::string>& more) {
  keys.insert(keys.end(), more.begin(), more.end());
  return keys;
}

std::string corpus(const TempDir& dir) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += "Line " + std::to_string(i * 7919 % 1000) + " of text.\n";
  test::write_file(dir / "c.txt", text);
  return "data.path=" + (dir / "c.txt");
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  std::memcpy(c.raw(), t.raw(), t.nbytes());
  return c;
}

TEST(Freeze, PatternsResolveToNames) {
  const ParamLayout l = Transformer::layout_for(tiny({"data.path=x"}).model);
  EXPECT_TRUE(match_frozen(l, "", "train.freeze").empty());
  EXPECT_EQ(match_frozen(l, " wte , h.1.attn.* ", "train.freeze"),
            (std::vector<std::string>{"wte", "h.1.attn.qkv.weight", "h.1.attn.proj.weight",
                                      "h.1.attn.qkv.bias", "h.1.attn.proj.bias"}));
  EXPECT_EQ(match_frozen(l, "h.[01].ln1.bias", "train.freeze"),
            (std::vector<std::string>{"h.0.ln1.bias", "h.1.ln1.bias"}));
  // The config resolves train.freeze when it is read.
  EXPECT_EQ(tiny({"data.path=x", "train.freeze=wpe,wte"}).frozen,
            (std::vector<std::string>{"wte", "wpe"}));
}

TEST(Freeze, BadPatternsAreNamed) {
  std::string msg = error_of([] { tiny({"data.path=x", "train.freeze=wte,h.*.atn.*"}); });
  EXPECT_TRUE(contains(msg, "train.freeze: pattern 'h.*.atn.*' matches no parameter")) << msg;
  EXPECT_TRUE(contains(msg, "h.N.attn.qkv.weight")) << msg;  // what there is to match
  msg = error_of([] { tiny({"data.path=x", "train.freeze=lm_head.weight"}); });  // tied: no head
  EXPECT_TRUE(contains(msg, "train.freeze: pattern 'lm_head.weight' matches no parameter")) << msg;
  msg = error_of([] { tiny({"data.path=x", "train.freeze=wte,,wpe"}); });
  EXPECT_TRUE(contains(msg, "train.freeze: empty pattern in 'wte,,wpe'")) << msg;
  msg = error_of([] { tiny({"data.path=x", "train.freeze=*"}); });
  EXPECT_TRUE(contains(msg, "train.freeze: '*' freezes every parameter")) << msg;
}

struct RunResult {
  std::vector<StepStats> history;
  Tensor params;
};

RunResult run(const std::vector<std::string>& keys) {
  Trainer t(tiny(keys));
  t.run();
  return {t.history(), copy_of(t.model().params())};
}

TEST(Freeze, FrozenRunKeepsWeightsAndCheckpointsTrainableMoments) {
  TempDir dir("nk_freeze");
  const std::vector<std::string> keys = {corpus(dir), "train.freeze=wte,h.0.ln1.*",
                                         "train.out_dir=" + (dir / "a"), "train.dtype=bf16"};
  const TrainConfig cfg = tiny(keys);
  Transformer init(cfg.model, cfg.dtype, cfg.seed, ParamInit::Random, cfg.frozen);
  Trainer t(cfg);
  t.run();
  ASSERT_EQ(t.history().size(), 12u);
  EXPECT_LT(t.history().back().loss, t.history().front().loss);
  const ParamLayout& l = t.model().layout();
  for (const ParamInfo& p : l.params()) {
    const bool same =
        same_bytes(ParamLayout::view(t.model().params(), p), ParamLayout::view(init.params(), p));
    EXPECT_EQ(same, !p.trainable) << p.name;  // frozen: untouched; trainable: trained
  }
  SafetensorsFile opt = CheckpointReader::open(dir / "a/checkpoints/step_00000012").optimizer();
  EXPECT_EQ(opt.metadata().at("frozen"), "wte,h.0.ln1.weight,h.0.ln1.bias");
  for (const ParamInfo& p : l.params()) {
    EXPECT_EQ(opt.has("exp_avg." + p.name), p.trainable) << p.name;
    EXPECT_EQ(opt.has("exp_avg_sq." + p.name), p.trainable) << p.name;
  }
}

TEST(Freeze, FrozenRunResumesExactly) {
  TempDir dir("nk_freeze");
  for (const char* dt : {"f32", "bf16"}) {
    SCOPED_TRACE(dt);
    const std::vector<std::string> data = {corpus(dir), "train.freeze=wte,h.1.mlp.*",
                                           std::string("train.dtype=") + dt};
    const std::string straight_dir = dir / (std::string("straight_") + dt);
    const std::string split_dir = dir / (std::string("split_") + dt);
    RunResult straight = run(with(data, {"train.out_dir=" + straight_dir}));
    RunResult head = run(with(data, {"train.out_dir=" + split_dir, "train.exit_at_step=5"}));
    ASSERT_EQ(head.history.size(), 5u);
    RunResult tail = run(with(data, {"train.out_dir=" + split_dir}));
    ASSERT_EQ(tail.history.size(), 7u);
    std::vector<StepStats> joined = head.history;
    joined.insert(joined.end(), tail.history.begin(), tail.history.end());
    ASSERT_EQ(joined.size(), straight.history.size());
    for (size_t i = 0; i < joined.size(); ++i) {
      EXPECT_EQ(joined[i].loss, straight.history[i].loss) << "step " << i + 1;
      EXPECT_EQ(joined[i].grad_norm, straight.history[i].grad_norm) << "step " << i + 1;
    }
    EXPECT_TRUE(same_bytes(tail.params, straight.params));
  }
}

TEST(Freeze, ResumeWithAnotherFreezeSetIsRefused) {
  TempDir dir("nk_freeze");
  const std::vector<std::string> data = {corpus(dir), "train.dtype=f32",
                                         "train.out_dir=" + (dir / "a"), "train.exit_at_step=2"};
  run(with(data, {"train.freeze=wte"}));
  std::string msg = error_of([&] { Trainer t(tiny(with(data, {"train.freeze=wte,wpe"}))); });
  EXPECT_TRUE(contains(msg, "train.freeze: checkpoint '")) << msg;
  EXPECT_TRUE(contains(msg, "was trained with wte frozen, but this run freezes wte,wpe")) << msg;
  msg = error_of([&] { Trainer t(tiny(data)); });
  EXPECT_TRUE(contains(msg, "was trained with wte frozen, but this run freezes nothing")) << msg;
  // A run with nothing frozen, resumed with something frozen.
  const std::vector<std::string> plain = {corpus(dir), "train.dtype=f32",
                                          "train.out_dir=" + (dir / "b"), "train.exit_at_step=2"};
  run(plain);
  msg = error_of([&] { Trainer t(tiny(with(plain, {"train.freeze=h.0.*"}))); });
  EXPECT_TRUE(contains(msg, "was trained with nothing frozen, but this run freezes h.0.")) << msg;
}

// The logged gradient norm (and so the clipping) covers the trainable
// gradients only: recomputed here from a model with nothing frozen, summing
// all but the frozen gradients (another summation order: a relative 1e-6).
TEST(Freeze, GradNormCountsTrainableGradientsOnly) {
  TempDir dir("nk_freeze");
  const TrainConfig cfg = tiny({corpus(dir), "train.dtype=f32", "train.freeze=wte,h.1.*",
                                "train.steps=1", "train.out_dir=" + (dir / "a")});
  Trainer t(cfg);
  std::vector<std::pair<Tensor, Tensor>> batches;
  t.set_batch_observer([&](int64_t, const Tensor& x, const Tensor& y) {
    batches.emplace_back(copy_of(x), copy_of(y));
  });
  t.run();
  ASSERT_EQ(batches.size(), 2u);
  Transformer m(cfg.model, cfg.dtype, cfg.seed);
  Activations acts(cfg.model, cfg.dtype, cfg.micro_batch, cfg.seq_len, true);
  m.zero_grads();
  for (auto& [x, y] : batches) m.forward_backward(acts, x, y, 0.5f);
  double trainable = 0;
  for (const ParamInfo& p : m.layout().params())
    if (std::find(cfg.frozen.begin(), cfg.frozen.end(), p.name) == cfg.frozen.end())
      trainable += ops::sum_squares(ParamLayout::view(m.grads(), p));
  const double want = std::sqrt(trainable), all = std::sqrt(ops::sum_squares(m.grads()));
  EXPECT_NEAR(t.history()[0].grad_norm, want, 1e-6 * want);
  EXPECT_GT(all - want, 1e-3 * want);  // the frozen gradients would have counted
}

// An exported model (no optimizer state) continued with parameters frozen:
// they keep the exported values.
TEST(Freeze, ResumeFromAnExportedModelFreezes) {
  TempDir dir("nk_freeze");
  const std::vector<std::string> data = {corpus(dir), "train.dtype=f32"};
  RunResult first = run(with(data, {"train.out_dir=" + (dir / "a"), "train.steps=4"}));
  Trainer t(tiny(with(data, {"train.out_dir=" + (dir / "b"), "train.freeze=wte",
                             "train.resume_from=" + (dir / "a/model")})));
  EXPECT_EQ(t.state().step, 4);
  const Tensor wte = copy_of(ParamLayout::view(t.model().params(), t.model().layout().find("wte")));
  t.run();
  EXPECT_EQ(t.history().size(), 8u);
  EXPECT_FALSE(t.model().layout().find("wte").trainable);
  EXPECT_TRUE(
      same_bytes(ParamLayout::view(t.model().params(), t.model().layout().find("wte")), wte));
  const ParamLayout unfrozen = Transformer::layout_for(tiny(data).model);
  EXPECT_TRUE(same_bytes(wte, ParamLayout::view(first.params, unfrozen.find("wte"))));
}

}  // namespace
}  // namespace nk
