// Tensor parallel (and sequence parallel, and with data parallel) against one
// process (shared/DESIGN.md: every parallel feature has an equivalence test).
// Each rank trains the single-process reference itself, then takes part in
// the parallel run of the same recipe; the loss at every step, the gradient
// norm and the whole weights after the last step (gathered from the shards)
// must agree within a relative 1e-5 in f32. The differences are only the
// order of additions: the row-parallel layers' partial products summed
// across ranks, the vocabulary's cross-entropy statistics combined from
// shards, the sequence-parallel norms' gradients summed across ranks.
//
// Run with 2 ranks (TP2, TP2 + SP, reshards between TP2 and one process) and
// 4 (TP4 with grouped-query attention, DP2 × TP2 with and without SP).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/rng.h"
#include "equivalence_util.h"
#include "nn/cross_entropy.h"
#include "ops/ops.h"
#include "parallel/tensor_parallel.h"
#include "parallel_env.h"
#include "train/trainer.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using test::mpi;

constexpr double kF32 = 1e-5;  // relative, as the data-parallel tests

struct Recipe {
  std::string preset;
  int tp = 2;
  bool sp = false;
  int64_t accum = 1;  // micro-batches per data-parallel rank per step
  int64_t n_head = 4, n_kv_head = 2;
  std::vector<std::string> extra = {};
};

Recipe recipe(const std::string& preset, int tp = 2, bool sp = false, int64_t accum = 1,
              int64_t n_head = 4, int64_t n_kv_head = 2, std::vector<std::string> extra = {}) {
  return {preset, tp, sp, accum, n_head, n_kv_head, std::move(extra)};
}

class TensorParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = mpi().world_size();
    rank_ = mpi().rank();
    world_mesh_ = std::make_unique<dist::Mesh>(world_, rank_, dist::MeshSpec{});
    world_groups_ = std::make_unique<dist::ProcessGroups>(mpi().make_groups(*world_mesh_, 120));
    const test::RunDirs dirs = test::prepare_run_dirs("tensor_parallel_mpi", world_, rank_);
    base_ = dirs.base;
    corpus_ = dirs.corpus;
    barrier();
  }
  void barrier() { world_groups_->get("world").barrier(); }

  // The recipe for a world of `dp` data-parallel replicas of `tp` ranks each
  // (dp = tp = 1: the single-process reference).
  TrainConfig config(const Recipe& r, const std::string& out, int tp, int64_t dp,
                     const std::vector<std::string>& extra = {}) {
    const int64_t B = 2;
    std::vector<std::string> o = {
        "model.preset=" + r.preset,
        "model.n_layer=2",
        "model.d_model=64",
        "model.n_head=" + std::to_string(r.n_head),
        "model.d_ff=128",
        "model.vocab_size=264",  // bytes, padded to a multiple of 8
        "data.path=" + corpus_.string(),
        "train.micro_batch=" + std::to_string(B),
        "train.global_batch=" + std::to_string(B * r.accum * dp),
        "train.seq_len=32",
        "train.steps=10",
        "train.lr=3e-3",
        "train.warmup_steps=2",
        "train.val_every=0",
        "train.log_every=100",
        "train.peak_tflops=1",
        "train.grad_clip=1.0",
        "train.out_dir=" + out,
        "train.dtype=f32",
        "parallel.tp=" + std::to_string(tp),
        std::string("parallel.sp=") + (r.sp && tp > 1 ? "true" : "false")};
    if (r.preset == "llama-tiny") o.push_back("model.n_kv_head=" + std::to_string(r.n_kv_head));
    o.insert(o.end(), r.extra.begin(), r.extra.end());
    o.insert(o.end(), extra.begin(), extra.end());
    ConfigSchema s = train_schema();
    return train_config_from(Config::load(s, "", o));
  }

  // The mesh and groups of a run of `tp`-way tensor parallelism over the world.
  struct Layout {
    std::unique_ptr<dist::Mesh> mesh;
    std::unique_ptr<dist::ProcessGroups> groups;
    TrainParallel par() const { return {mesh.get(), groups.get()}; }
  };
  Layout layout(const TrainConfig& cfg) {
    Layout l;
    l.mesh = std::make_unique<dist::Mesh>(train_mesh(cfg, world_, rank_));
    l.groups = std::make_unique<dist::ProcessGroups>(mpi().make_groups(*l.mesh, 120));
    return l;
  }

  // The whole weights of a (tensor-parallel) trainer, gathered on every rank.
  static Tensor whole_weights(Trainer& t) {
    return parallel::gather_tensor_parallel(t.model(), t.model().params());
  }

  static void expect_same_losses(const Trainer& ref, const Trainer& t, size_t first, double tol,
                                 const std::string& what) {
    ASSERT_EQ(ref.history().size(), first + t.history().size()) << what;
    for (size_t i = 0; i < t.history().size(); ++i) {
      const StepStats &a = ref.history()[first + i], &b = t.history()[i];
      EXPECT_LE(std::abs(a.loss - b.loss), tol * std::abs(a.loss))
          << what << " step " << a.step << ": " << a.loss << " vs " << b.loss;
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 10 * tol * a.grad_norm) << what << " step " << a.step;
    }
  }

  // Trains `r` on one process and under tp × (world / tp), and compares.
  void check(const Recipe& r) {
    ASSERT_EQ(world_ % r.tp, 0);
    const int64_t dp = world_ / r.tp;
    Trainer ref(config(r, (base_ / ("ref_rank" + std::to_string(rank_))).string(), 1, dp));
    ref.run();
    const TrainConfig cfg = config(r, (base_ / "tp").string(), r.tp, dp);
    Layout l = layout(cfg);
    Trainer t(cfg, l.par());
    EXPECT_LT(t.model().layout().count(), ref.model().layout().count()) << "not sharded";
    t.run();
    ASSERT_EQ(ref.history().size(), 10u);
    expect_same_losses(ref, t, 0, kF32, "tp");
    test::expect_weights_close(ref.model().layout(), ref.model().params(), whole_weights(t), kF32,
                               "tp ");
    // Rank 0 exported the whole model: the reference's weights.
    barrier();
    if (rank_ == 0) {
      EXPECT_TRUE(fs::exists(base_ / "tp" / "model" / "model.safetensors"));
      EXPECT_TRUE(fs::exists(base_ / "tp" / "checkpoints" / "step_00000010" / "manifest.json"));
    }
  }

  int world_ = 1, rank_ = 0;
  std::unique_ptr<dist::Mesh> world_mesh_;
  std::unique_ptr<dist::ProcessGroups> world_groups_;
  fs::path base_, corpus_;
};

// Vocabulary-parallel cross-entropy against the plain one over the whole
// logits, forward and backward, with ignored targets and a padded
// vocabulary (264 ids, the targets below 257): each rank holds its columns.
// Tolerance: the shards' sums of exponentials are added in another order,
// so the log-sum-exp (an f32 of magnitude up to ~16 here, last bit ~1e-6)
// can differ in its last bits: relative 1e-6 on the loss, and on each
// gradient entry exp(x - lse) the same relative error (2e-6 allowed, plus
// 1e-9 absolute for the zeros of ignored rows).
TEST_F(TensorParallel, VocabCrossEntropyEqualsThePlainOne) {
  const int64_t N = 37, V = 264, real = 257, Vs = V / world_;
  Rng rng(7);
  Tensor logits = Tensor::empty({N, V}, DType::F32), targets = Tensor::empty({N}, DType::I32);
  for (int64_t i = 0; i < N * V; ++i) logits.data<float>()[i] = float(3 * rng.normal());
  for (int64_t i = 0; i < N; ++i)
    targets.data<int32_t>()[i] = i % 5 == 3 ? -100 : int32_t(rng.below(uint64_t(real)));
  const float scale = 0.25f;
  Tensor losses = Tensor::empty({N}, DType::F32), dlogits = Tensor::empty({N, V}, DType::F32);
  ops::cross_entropy_forward_backward(losses, dlogits, logits, targets, -100, scale);

  nn::VocabCrossEntropy ce;
  ce.tp = {&world_groups_->get("world"), false};
  ce.vocab_start = rank_ * Vs;
  Tensor stats = Tensor::empty({nn::VocabCrossEntropy::stats_size(N)}, DType::F32);
  for (bool backward : {false, true}) {
    Tensor mine = Tensor::empty({N, Vs}, DType::F32), l = Tensor::empty({N}, DType::F32);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < Vs; ++j)
        mine.data<float>()[i * Vs + j] = logits.data<float>()[i * V + ce.vocab_start + j];
    ce.forward(l, mine, targets, backward, scale, stats);
    for (int64_t i = 0; i < N; ++i) {
      const float want = losses.data<float>()[i];
      EXPECT_NEAR(l.data<float>()[i], want, 1e-6 * std::abs(want)) << "row " << i;
      if (targets.data<int32_t>()[i] == -100) {
        EXPECT_EQ(l.data<float>()[i], 0.f);
      }
    }
    for (int64_t i = 0; backward && i < N; ++i)
      for (int64_t j = 0; j < Vs; ++j)
        ASSERT_NEAR(mine.data<float>()[i * Vs + j],
                    dlogits.data<float>()[i * V + ce.vocab_start + j],
                    2e-6 * std::abs(dlogits.data<float>()[i * V + ce.vocab_start + j]) + 1e-9)
            << "row " << i << " id " << ce.vocab_start + j;
  }
}

TEST_F(TensorParallel, Gpt2Tp2) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check(recipe("gpt-tiny"));
}
TEST_F(TensorParallel, LlamaTp2GroupedQuery) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check(recipe("llama-tiny", 2, false, 2, 8, 2));
}
TEST_F(TensorParallel, Gpt2Tp2SequenceParallel) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check(recipe("gpt-tiny", 2, true, 2));
}
TEST_F(TensorParallel, LlamaTp2SequenceParallel) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check(recipe("llama-tiny", 2, true));
}
// Tied embeddings through the vocabulary-parallel head, with selective
// recompute.
TEST_F(TensorParallel, LlamaTp2TiedSelectiveRecompute) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check(recipe("llama-tiny", 2, true, 1, 4, 2,
               {"model.tied_embeddings=true", "train.recompute=selective"}));
}
TEST_F(TensorParallel, LlamaTp4GroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(recipe("llama-tiny", 4, false, 1, 8, 4));
}
TEST_F(TensorParallel, LlamaTp4SequenceParallel) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(recipe("llama-tiny", 4, true, 1, 8, 4));
}
TEST_F(TensorParallel, Gpt2Dp2Tp2) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(recipe("gpt-tiny", 2, false, 2));
}
TEST_F(TensorParallel, LlamaDp2Tp2SequenceParallel) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(recipe("llama-tiny", 2, true, 1));
}

// Resharding: a checkpoint saved under one layout resumes under another and
// continues the unbroken run's losses (steps 6-10), within the same
// tolerance; resumed under its own layout, bit for bit.
TEST_F(TensorParallel, ReshardCheckpoints) {
  const Recipe r = recipe("llama-tiny", world_, true, 1, 8, 4);
  const int64_t dp = 1;
  // The unbroken run under tp = world, and the same stopped after step 5.
  const TrainConfig whole_cfg = config(r, (base_ / "whole").string(), r.tp, dp);
  Layout l = layout(whole_cfg);
  Trainer whole(whole_cfg, l.par());
  whole.run();
  {
    Trainer first(config(r, (base_ / "split").string(), r.tp, dp, {"train.exit_at_step=5"}),
                  l.par());
    first.run();
  }
  barrier();
  const std::string ckpt = (base_ / "split" / "checkpoints" / "step_00000005").string();
  {  // the same layout: bit for bit
    Trainer again(config(r, (base_ / "split").string(), r.tp, dp), l.par());
    ASSERT_EQ(again.state().step, 5);
    again.run();
    ASSERT_EQ(again.history().size(), 5u);
    for (size_t i = 0; i < 5; ++i)
      EXPECT_EQ(whole.history()[5 + i].loss, again.history()[i].loss) << "step " << 6 + i;
  }
  {  // tp = world -> one process (every rank on its own)
    Trainer one(config(r, (base_ / ("one_rank" + std::to_string(rank_))).string(), 1, dp,
                       {"train.resume_from=" + ckpt}));
    ASSERT_EQ(one.state().step, 5);
    one.run();
    expect_same_losses(whole, one, 5, kF32, "tp" + std::to_string(r.tp) + " -> 1");
  }
  // One process -> tp = world: the single-process run stopped at step 5 (on
  // rank 0; the others wait), resumed by every rank under tensor parallelism.
  const std::string single = (base_ / "single").string();
  if (rank_ == 0) {
    Trainer s(config(r, single, 1, dp, {"train.exit_at_step=5"}));
    s.run();
  }
  barrier();
  Trainer back(config(r, (base_ / "back").string(), r.tp, dp,
                      {"train.resume_from=" + single + "/checkpoints/step_00000005"}),
               l.par());
  ASSERT_EQ(back.state().step, 5);
  back.run();
  expect_same_losses(whole, back, 5, kF32, "1 -> tp" + std::to_string(r.tp));
}

}  // namespace
}  // namespace nk
