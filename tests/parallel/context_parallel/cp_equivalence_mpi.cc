// Context parallelism (nn/context_parallel.h: each row split into 2·cp
// chunks over the "cp" group, ring attention, gradients summed over dp-cp)
// against one process (shared/DESIGN.md: every parallel feature has an
// equivalence test). Each rank trains the single-process reference itself,
// then takes part in the context-parallel run of the same recipe: the loss
// and gradient norm at each of 10 steps within a relative 1e-5 in f32, the
// first step's gradients per tensor within 1e-5, the weights after ten steps
// within 1e-3 (Adam's near-zero elements, as tests/parallel/tensor_parallel
// explains). The differences are only the order of additions: the ring's
// blocks merged through the log-sum-exp, the loss and gradients summed over
// the cp ranks' tokens.
//
// Run with 2 ranks (CP2: GPT-2's learned positions, Llama's rotary ones with
// grouped-query attention, a sliding window with full recompute, ZeRO-1 over the cp ranks) and 4
// (CP4 with GQA, CP2 × DP2, CP2 × DP2 with FSDP, CP2 × TP2).
#include <gtest/gtest.h>

#include <cmath>

#include "equivalence_util.h"
#include "ops/ops.h"
#include "parallel/model_parallel.h"
#include "parallel_env.h"
#include "sharded_masters.h"
#include "train/trainer.h"

namespace nk {
namespace {

using test::mpi;

constexpr double kF32 = 1e-5, kTenSteps = 1e-3;

struct Recipe {
  std::string preset;
  int cp = 2, tp = 1;
  int64_t n_head = 4, n_kv_head = 2;
  int64_t accum = 1;  // micro-batches per data-parallel rank per step
  std::vector<std::string> extra = {};
};

class ContextParallel : public test::RankTest {
 protected:
  void SetUp() override { set_up("context_parallel_mpi"); }

  TrainConfig config(const Recipe& r, const std::string& out, int cp, int tp, int64_t dp) {
    const int64_t B = 2;
    std::vector<std::string> o = {"model.preset=" + r.preset,
                                  "model.n_layer=2",
                                  "model.d_model=64",
                                  "model.n_head=" + std::to_string(r.n_head),
                                  "model.d_ff=128",
                                  "model.vocab_size=264",
                                  "train.val_every=5",
                                  "train.val_batches=1",
                                  "train.grad_clip=1.0",
                                  "train.out_dir=" + out,
                                  "train.dtype=f32",
                                  "parallel.cp=" + std::to_string(cp),
                                  "parallel.tp=" + std::to_string(tp)};
    for (std::string& c : common_options(B, B * r.accum * dp)) o.push_back(std::move(c));
    if (r.preset == "llama-tiny") o.push_back("model.n_kv_head=" + std::to_string(r.n_kv_head));
    o.insert(o.end(), r.extra.begin(), r.extra.end());
    ConfigSchema s = train_schema();
    return train_config_from(Config::load(s, "", o));
  }

  void check(const Recipe& r) {
    ASSERT_EQ(world_ % (r.cp * r.tp), 0);
    const int64_t dp = world_ / (r.cp * r.tp);
    Trainer ref(config(r, (base_ / ("ref_rank" + std::to_string(rank_))).string(), 1, 1, dp));
    Tensor ref_grads, cp_grads;
    ref.run([&](const StepStats& s) {
      if (s.step != 1) return;
      ref_grads = Tensor::empty(ref.model().grads().shape(), DType::F32);
      ops::convert(ref_grads, ref.model().grads());
    });
    const TrainConfig cfg = config(r, (base_ / "cp").string(), r.cp, r.tp, dp);
    auto mesh = std::make_unique<dist::Mesh>(train_mesh(cfg, world_, rank_));
    ASSERT_EQ(mesh->cp(), r.cp);
    auto groups = std::make_unique<dist::ProcessGroups>(mpi().make_groups(*mesh, 120));
    Trainer t(cfg, TrainParallel{mesh.get(), groups.get()});
    auto whole = [&](const Tensor& arena) {
      if (r.tp == 1) {
        Tensor c = Tensor::empty(arena.shape(), DType::F32);
        ops::convert(c, arena);
        return c;
      }
      return parallel::gather_model(t.model(), arena, &groups->get("pp"));
    };
    // Sharded (parallel.shard): a rank holds its own block of the summed
    // gradients only; the steps' losses and norms and the weights after ten
    // steps are checked.
    const bool sharded = cfg.ddp.shard != parallel::Shard::None;
    t.run([&](const StepStats& s) {
      if (s.step == 1 && !sharded) cp_grads = whole(t.model().grads());
    });
    ASSERT_EQ(ref.history().size(), 10u);
    ASSERT_EQ(t.history().size(), 10u);
    for (size_t i = 0; i < 10; ++i) {
      const StepStats &a = ref.history()[i], &b = t.history()[i];
      EXPECT_LE(std::abs(a.loss - b.loss), kF32 * std::abs(a.loss))
          << "step " << a.step << ": " << a.loss << " vs " << b.loss;
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 10 * kF32 * a.grad_norm) << "step " << a.step;
      EXPECT_EQ(std::isnan(a.val_loss), std::isnan(b.val_loss)) << "step " << a.step;
      if (!std::isnan(a.val_loss)) {
        EXPECT_LE(std::abs(a.val_loss - b.val_loss), kF32 * std::abs(a.val_loss))
            << "validation at step " << a.step << ": " << a.val_loss << " vs " << b.val_loss;
      }
    }
    if (!sharded)
      test::expect_weights_close(ref.model().layout(), ref_grads, cp_grads, kF32,
                                 "gradient of step 1: ");
    const Tensor after =
        sharded ? test::whole_masters(t, groups->get("world")) : whole(t.model().params());
    test::expect_weights_close(ref.model().layout(), ref.model().params(), after, kTenSteps,
                               "after step 10: ");
    if (sharded) {  // each rank's optimizer holds about 1/(dp cp) of the state
      const int64_t n = int64_t(world_);
      EXPECT_LE(t.optimizer().state_size(), ref.optimizer().state_size() / n + 64 * n);
    }
  }
};

TEST_F(ContextParallel, Gpt2Cp2LearnedPositions) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"gpt-tiny", 2, 1, 4, 4});
}
TEST_F(ContextParallel, LlamaCp2GroupedQuery) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"llama-tiny", 2, 1, 4, 2, 2});
}
// A sliding window shorter than the row and crossing the chunks' edges
// (chunks of 8 tokens, window 12), and full recompute (the ring runs again
// in the backward).
TEST_F(ContextParallel, LlamaCp2SlidingWindowFullRecompute) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"llama-tiny", 2, 1, 4, 2, 1, {"model.sliding_window=12", "train.recompute=full"}});
}
TEST_F(ContextParallel, LlamaCp4GroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 4, 1, 4, 2});
}
TEST_F(ContextParallel, LlamaCp2Dp2GroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 1, 8, 2, 2});
}
// Gemma 2: a score scale of its own (query_pre_attn_scalar), capped scores
// (a cap of 1.5, far from linear), local layers' windows crossing the chunks.
TEST_F(ContextParallel, Gemma2Cp2CappedScoresAndWindows) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"gemma2-tiny",
         2,
         1,
         4,
         2,
         1,
         {"model.attn_logit_softcap=1.5", "model.query_pre_attn_scalar=20",
          "model.sliding_window=12"}});
}
// The distributed optimizer and FSDP shard over the same "dp-cp" group the
// gradients are summed over: a CP2 run alone shards over its two cp ranks.
TEST_F(ContextParallel, LlamaCp2ZeroOneShardsOverTheCpRanks) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"llama-tiny", 2, 1, 4, 2, 1, {"parallel.shard=optimizer"}});
}
TEST_F(ContextParallel, LlamaCp2Dp2Fsdp) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 1, 8, 2, 1, {"parallel.shard=full"}});
}
TEST_F(ContextParallel, LlamaCp2Tp2GroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 2, 8, 4});
}

}  // namespace
}  // namespace nk
