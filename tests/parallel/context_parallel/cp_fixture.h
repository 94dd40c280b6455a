// The context-parallel equivalence fixture (tests/parallel/context_parallel,
// tests/parallel/cp_variants): each rank trains the single-process
// reference itself, then takes part in the context-parallel run of the same
// recipe, whose losses, gradients and weights check() compares (see
// cp_equivalence_mpi.cc for the tolerances and why).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "equivalence_util.h"
#include "nn/context_parallel.h"
#include "ops/ops.h"
#include "parallel/model_parallel.h"
#include "parallel_env.h"
#include "sharded_masters.h"
#include "train/trainer.h"

namespace nk::cp_test {

using test::mpi;

constexpr double kF32 = 1e-5, kTenSteps = 1e-3;
inline const std::string kA2a = "parallel.cp_comm_type=a2a";
inline const std::string kAllGather = "parallel.cp_comm_type=all_gather";

struct Recipe {
  std::string preset;
  int cp = 2, tp = 1;
  int64_t n_head = 4, n_kv_head = 2;
  int64_t accum = 1;  // micro-batches per data-parallel rank per step
  std::vector<std::string> extra = {};
  int pp = 1, vp = 1;  // pipeline stages, virtual stages per rank
  int64_t n_layer = 2;
  // Packed fine-tuning rows (data.sft_path, several documents per row, their
  // boundaries crossing the chunks) instead of the corpus.
  bool packed = false;
};

// The variant the recipe asks for (parallel.cp_comm_type; p2p by default).
inline nn::CpComm comm_of(const Recipe& r) {
  const std::string key = "parallel.cp_comm_type=";
  for (const std::string& e : r.extra)
    if (e.starts_with(key)) return nn::parse_cp_comm(e.substr(key.size()));
  return nn::CpComm::P2P;
}

// A pipelined recipe: cp × pp ranks over a 4-layer model, 4 micro-batches
// per step (the 1F1B schedule's steady state; the interleaved one's m a
// multiple of pp).
inline Recipe pipelined(const std::string& preset, int vp, int64_t n_head, int64_t n_kv_head,
                        std::vector<std::string> extra = {}) {
  Recipe r{preset, 2, 1, n_head, n_kv_head, 4, std::move(extra)};
  r.pp = 2;
  r.vp = vp;
  r.n_layer = 4;
  return r;
}

class ContextParallel : public test::RankTest {
 protected:
  void SetUp() override { set_up_with("context_parallel_mpi"); }

  // set_up, and rank 0 writes the prompt/answer records of packed recipes
  // (many lengths: each row packs several, cut across the chunks) once.
  void set_up_with(const std::string& suite) {
    set_up(suite);
    sft_ = base_.parent_path() / "sft.jsonl";
    if (rank_ == 0 && !std::filesystem::exists(sft_)) {
      std::ofstream o(sft_.string() + ".tmp");
      uint64_t x = 5;
      auto next = [&](int n) {  // a small LCG: the same records on every run
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        return int((x >> 33) % uint64_t(n));
      };
      for (int i = 0; i < 64; ++i) {
        std::string w;
        for (int k = 1 + next(6); k > 0; --k) w += char('a' + next(10));
        std::string answer;
        for (int k = 1 + next(2); k > 0; --k) answer += w;
        o << R"({"input": "repeat )" << w << R"(:", "output": " )" << answer << "\"}\n";
      }
      o.close();
      std::filesystem::rename(sft_.string() + ".tmp", sft_);
    }
    barrier();
  }

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
    for (std::string& c : common_options(B, B * r.accum * dp))
      o.push_back(r.packed && c.starts_with("data.path=") ? "data.path=" : std::move(c));
    if (r.packed)
      for (const std::string& c :
           {"data.sft_path=" + sft_.string(), "data.sft_valid_path=" + sft_.string(),
            std::string("data.pack=true"), std::string("data.chat_template=plain")})
        o.push_back(c);
    if (r.preset == "llama-tiny") o.push_back("model.n_kv_head=" + std::to_string(r.n_kv_head));
    if (pp > 1) o.push_back("parallel.vp=" + std::to_string(r.vp));
    // The one-process reference has no tp to split over, nor cp groups to
    // size (a2a+p2p's must multiply to parallel.cp).
    for (const std::string& e : r.extra)
      if ((tp > 1 || e != "parallel.sp=true") &&
          (cp > 1 || (!e.starts_with("parallel.hierarchical_context_parallel_sizes=") &&
                      e != "parallel.cp_comm_type=a2a+p2p")))
        o.push_back(e);
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
    // The variant asked for ran: its buffers, not the others', were used
    // (a2a+p2p: the all-to-all's, and the ring's over its a2a group's tokens).
    const nn::ContextParallel& used = t.model().context_parallel();
    const nn::CpComm comm = comm_of(r);
    const int64_t Tl = 32 / r.cp;
    EXPECT_EQ(used.comm_type, comm);
    EXPECT_EQ(used.heads->T, comm == nn::CpComm::A2A || comm == nn::CpComm::A2AP2P ? Tl : 0);
    EXPECT_EQ(used.ring->T, comm == nn::CpComm::P2P      ? Tl
                            : comm == nn::CpComm::A2AP2P ? Tl * used.a2a_comm->size()
                                                         : 0);
    EXPECT_EQ(used.gather->T, comm == nn::CpComm::AllGather ? Tl : 0);
    if (comm == nn::CpComm::A2AP2P) {
      EXPECT_EQ(used.a2a_comm->size() * used.p2p_comm->size(), r.cp);
    }
    const bool sp = std::find(r.extra.begin(), r.extra.end(), "parallel.sp=true") != r.extra.end();
    EXPECT_EQ(t.model().tensor_parallel().sp(), sp);
    ASSERT_EQ(ref.history().size(), 10u);
    ASSERT_EQ(t.history().size(), 10u);
    double worst_loss = 0, worst_norm = 0;  // relative, over the 10 steps (reported)
    for (size_t i = 0; i < 10; ++i) {
      const StepStats &a = ref.history()[i], &b = t.history()[i];
      worst_loss = std::max(worst_loss, std::abs(a.loss - b.loss) / std::abs(a.loss));
      worst_norm = std::max(worst_norm, std::abs(a.grad_norm - b.grad_norm) / a.grad_norm);
      EXPECT_LE(std::abs(a.loss - b.loss), kF32 * std::abs(a.loss))
          << "step " << a.step << ": " << a.loss << " vs " << b.loss;
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 10 * kF32 * a.grad_norm) << "step " << a.step;
      EXPECT_EQ(std::isnan(a.val_loss), std::isnan(b.val_loss)) << "step " << a.step;
      if (!std::isnan(a.val_loss)) {
        EXPECT_LE(std::abs(a.val_loss - b.val_loss), kF32 * std::abs(a.val_loss))
            << "validation at step " << a.step << ": " << a.val_loss << " vs " << b.val_loss;
      }
    }
    if (rank_ == 0)
      std::printf("  largest relative difference over 10 steps: loss %.1e, gradient norm %.1e\n",
                  worst_loss, worst_norm);
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

  std::filesystem::path sft_;  // the packed recipes' records
};

}  // namespace nk::cp_test
