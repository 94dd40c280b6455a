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
// (CP4 with GQA, CP2 × DP2, CP2 × DP2 with FSDP, CP2 × TP2, CP2 × TP2 with
// sequence parallelism; CP2 × PP2 with the 1F1B and the interleaved
// schedules, each stage's attention ringing over its own cp group, and its
// checkpoints resumed on one process and the other way); and 8 (CP2 × PP2 ×
// DP2 interleaved, CP2 × TP2 × PP2). The all-to-all variant
// (parallel.cp_comm_type=a2a, "A2a" tests) the same: CP2 (GQA, GPT-2, Gemma
// 2's caps and windows), CP4, CP2 × DP2, CP2 × TP2 with and without SP; its
// differences from one process are only the loss's and gradients' sums over
// the ranks (the attention is one process's kernel on each rank's heads).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

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
const std::string kA2a = "parallel.cp_comm_type=a2a";

struct Recipe {
  std::string preset;
  int cp = 2, tp = 1;
  int64_t n_head = 4, n_kv_head = 2;
  int64_t accum = 1;  // micro-batches per data-parallel rank per step
  std::vector<std::string> extra = {};
  int pp = 1, vp = 1;  // pipeline stages, virtual stages per rank
  int64_t n_layer = 2;
};

// A pipelined recipe: cp × pp ranks over a 4-layer model, 4 micro-batches
// per step (the 1F1B schedule's steady state; the interleaved one's m a
// multiple of pp).
Recipe pipelined(const std::string& preset, int vp, int64_t n_head, int64_t n_kv_head,
                 std::vector<std::string> extra = {}) {
  Recipe r{preset, 2, 1, n_head, n_kv_head, 4, std::move(extra)};
  r.pp = 2;
  r.vp = vp;
  r.n_layer = 4;
  return r;
}

class ContextParallel : public test::RankTest {
 protected:
  void SetUp() override { set_up("context_parallel_mpi"); }

  // pp 1: no pipeline (the reference); else the recipe's stages.
  TrainConfig config(const Recipe& r, const std::string& out, int cp, int tp, int64_t dp,
                     int pp = 1, const std::vector<std::string>& more = {}) {
    const int64_t B = 2;
    std::vector<std::string> o = {"model.preset=" + r.preset,
                                  "model.n_layer=" + std::to_string(r.n_layer),
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
                                  "parallel.tp=" + std::to_string(tp),
                                  "parallel.pp=" + std::to_string(pp)};
    for (std::string& c : common_options(B, B * r.accum * dp)) o.push_back(std::move(c));
    if (r.preset == "llama-tiny") o.push_back("model.n_kv_head=" + std::to_string(r.n_kv_head));
    if (pp > 1) o.push_back("parallel.vp=" + std::to_string(r.vp));
    for (const std::string& e : r.extra)  // the one-process reference has no tp to split over
      if (tp > 1 || e != "parallel.sp=true") o.push_back(e);
    o.insert(o.end(), more.begin(), more.end());
    ConfigSchema s = train_schema();
    return train_config_from(Config::load(s, "", o));
  }

  void check(const Recipe& r) {
    ASSERT_EQ(world_ % (r.cp * r.tp * r.pp), 0);
    const int64_t dp = world_ / (r.cp * r.tp * r.pp);
    Trainer ref(config(r, (base_ / ("ref_rank" + std::to_string(rank_))).string(), 1, 1, dp));
    Tensor ref_grads, cp_grads;
    ref.run([&](const StepStats& s) {
      if (s.step != 1) return;
      ref_grads = Tensor::empty(ref.model().grads().shape(), DType::F32);
      ops::convert(ref_grads, ref.model().grads());
    });
    const TrainConfig cfg = config(r, (base_ / "cp").string(), r.cp, r.tp, dp, r.pp);
    auto mesh = std::make_unique<dist::Mesh>(train_mesh(cfg, world_, rank_));
    ASSERT_EQ(mesh->cp(), r.cp);
    ASSERT_EQ(mesh->pp(), r.pp);
    auto groups = std::make_unique<dist::ProcessGroups>(mpi().make_groups(*mesh, 120));
    Trainer t(cfg, TrainParallel{mesh.get(), groups.get()});
    if (r.pp > 1) {
      EXPECT_EQ(t.model().stage().ranges(t.model().config()).size(), size_t(r.vp))
          << "not the schedule asked for";
      // Every cp group lies inside one pipeline stage: its ranks hold the
      // same layers, and their attention rings over it.
      auto stage_of = [&](int world_rank) {
        for (const std::vector<int>& g : mesh->group("pp").all)
          for (size_t i = 0; i < g.size(); ++i)
            if (g[i] == world_rank) return int(i);
        return -1;
      };
      for (const std::vector<int>& g : mesh->group("cp").all)
        for (int m : g) EXPECT_EQ(stage_of(m), stage_of(g[0])) << "cp group across stages";
      EXPECT_EQ(stage_of(rank_), mesh->rank_in("pp"));
    }
    auto whole = [&](const Tensor& arena) {
      if (r.tp == 1 && r.pp == 1) {
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
    // The variant asked for ran: its buffers, not the other's, were used.
    const nn::ContextParallel& used = t.model().context_parallel();
    const bool a2a = std::find(r.extra.begin(), r.extra.end(), kA2a) != r.extra.end();
    EXPECT_EQ(used.comm_type, a2a ? nn::CpComm::A2A : nn::CpComm::P2P);
    EXPECT_EQ(used.heads->T, a2a ? 32 / r.cp : 0);
    EXPECT_EQ(used.ring->T, a2a ? 0 : 32 / r.cp);
    const bool sp = std::find(r.extra.begin(), r.extra.end(), "parallel.sp=true") != r.extra.end();
    EXPECT_EQ(t.model().tensor_parallel().sp(), sp);
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

  // Steps [first, first + got's) of `ref` against got's, within 1e-5.
  static void expect_same_losses(const std::vector<StepStats>& ref,
                                 const std::vector<StepStats>& got, size_t first,
                                 const std::string& what) {
    ASSERT_EQ(ref.size(), first + got.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
      const StepStats &a = ref[first + i], &b = got[i];
      EXPECT_LE(std::abs(a.loss - b.loss), kF32 * std::abs(a.loss))
          << what << " step " << a.step << ": " << a.loss << " vs " << b.loss;
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 10 * kF32 * a.grad_norm) << what << " step " << a.step;
      if (!std::isnan(a.val_loss)) {
        EXPECT_LE(std::abs(a.val_loss - b.val_loss), kF32 * std::abs(a.val_loss))
            << what << " validation at step " << a.step;
      }
    }
  }

  // Resharding across layouts: `r` (cp × pp over the whole world) stopped
  // after step 5 resumes on one process (every rank alone), and a
  // one-process run stopped after step 5 resumes under cp × pp; both
  // continue one process's 10 steps within 1e-5.
  void reshard(const Recipe& r) {
    ASSERT_EQ(world_, r.cp * r.tp * r.pp);
    namespace fs = std::filesystem;
    const std::string me = "_rank" + std::to_string(rank_);
    Trainer ref(config(r, (base_ / ("ref" + me)).string(), 1, 1, 1));
    ref.run();
    ASSERT_EQ(ref.history().size(), 10u);
    auto parallel_run = [&](const std::string& out, const std::vector<std::string>& more) {
      const TrainConfig cfg = config(r, out, r.cp, r.tp, 1, r.pp, more);
      auto mesh = std::make_unique<dist::Mesh>(train_mesh(cfg, world_, rank_));
      auto groups = std::make_unique<dist::ProcessGroups>(mpi().make_groups(*mesh, 120));
      Trainer t(cfg, TrainParallel{mesh.get(), groups.get()});
      const int64_t resumed = t.state().step;
      t.run();
      barrier();
      return std::make_pair(resumed, t.history());
    };
    // cp × pp -> one process.
    parallel_run((base_ / "split").string(), {"train.exit_at_step=5"});
    const std::string ckpt = (base_ / "split" / "checkpoints" / "step_00000005").string();
    ASSERT_TRUE(fs::exists(ckpt)) << ckpt;
    {
      Trainer one(
          config(r, (base_ / ("one" + me)).string(), 1, 1, 1, 1, {"train.resume_from=" + ckpt}));
      ASSERT_EQ(one.state().step, 5);
      one.run();
      expect_same_losses(ref.history(), one.history(), 5, "cp × pp -> one process");
    }
    // One process -> cp × pp (saved by rank 0; the others wait).
    const std::string single = (base_ / "single").string();
    if (rank_ == 0) {
      Trainer s(config(r, single, 1, 1, 1, 1, {"train.exit_at_step=5"}));
      s.run();
    }
    barrier();
    const auto [resumed, back] = parallel_run(
        (base_ / "back").string(), {"train.resume_from=" + single + "/checkpoints/step_00000005"});
    EXPECT_EQ(resumed, 5);
    expect_same_losses(ref.history(), back, 5, "one process -> cp × pp");
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
// Pipeline parallel: each stage's layers ring over that stage's cp group,
// the residual streams sent between stages are a cp rank's chunks, the loss
// is summed over the chunks and the gradients over dp-cp. GPT-2 (learned
// positions on the first stage, the tied token table's two copies on the
// first and last) under 1F1B; Llama with grouped-query attention (8 query
// heads on 2 key/value heads) under 1F1B and under the interleaved
// schedule (2 virtual stages per rank: the last rank's chunk output goes on
// to rank 0's next chunk).
TEST_F(ContextParallel, Gpt2Cp2Pp2) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(pipelined("gpt-tiny", 1, 4, 4));
}
TEST_F(ContextParallel, LlamaCp2Pp2GroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(pipelined("llama-tiny", 1, 8, 2));
}
TEST_F(ContextParallel, LlamaCp2Pp2InterleavedGroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(pipelined("llama-tiny", 2, 8, 2));
}
// 8 ranks: CP2 × PP2 × DP2 interleaved (dp-cp of 4 ranks per stage) and
// CP2 × TP2 × PP2 (each stage's ring over cp, its heads over tp).
TEST_F(ContextParallel, LlamaCp2Dp2Pp2Interleaved) {
  if (world_ != 8) GTEST_SKIP() << "8 ranks";
  check(pipelined("llama-tiny", 2, 8, 2));
}
TEST_F(ContextParallel, LlamaCp2Tp2Pp2GroupedQuery) {
  if (world_ != 8) GTEST_SKIP() << "8 ranks";
  Recipe r = pipelined("llama-tiny", 1, 8, 2);
  r.tp = 2;
  check(r);
}
// A checkpoint saved under CP2 × PP2 (interleaved) resumes on one process,
// and one process's under CP2 × PP2, on one process's losses.
TEST_F(ContextParallel, ReshardCp2Pp2InterleavedAndOneProcess) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  reshard(pipelined("llama-tiny", 2, 8, 2));
}

// Sequence parallelism: each rank's local tokens (its two chunks) split over
// its tp pair for the norms and residual stream.
TEST_F(ContextParallel, LlamaCp2Tp2SequenceParallel) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 2, 8, 4, 1, {"parallel.sp=true"}});
}

// All-to-all (Ulysses): 4 query and 2 key/value heads give each cp rank 2
// and 1 (one GQA group).
TEST_F(ContextParallel, LlamaCp2A2aGroupedQuery) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"llama-tiny", 2, 1, 4, 2, 2, {kA2a}});
}
TEST_F(ContextParallel, Gpt2Cp2A2aLearnedPositions) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"gpt-tiny", 2, 1, 4, 4, 1, {kA2a}});
}
TEST_F(ContextParallel, Gemma2Cp2A2aCappedScoresAndWindows) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"gemma2-tiny",
         2,
         1,
         4,
         2,
         1,
         {kA2a, "model.attn_logit_softcap=1.5", "model.query_pre_attn_scalar=20",
          "model.sliding_window=12", "train.recompute=full"}});
}
TEST_F(ContextParallel, LlamaCp4A2aGroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 4, 1, 8, 4, 1, {kA2a}});
}
TEST_F(ContextParallel, LlamaCp2Dp2A2aGroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 1, 8, 2, 2, {kA2a}});
}
TEST_F(ContextParallel, LlamaCp2Tp2A2aGroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 2, 8, 4, 1, {kA2a}});
}
TEST_F(ContextParallel, LlamaCp2Tp2A2aSequenceParallel) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 2, 8, 4, 1, {kA2a, "parallel.sp=true"}});
}

}  // namespace
}  // namespace nk
