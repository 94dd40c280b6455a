// Tensor parallel (with sequence parallel), pipeline parallel (1F1B) and
// their products with data parallel, against one process (shared/DESIGN.md:
// every parallel feature has an equivalence test). Each rank trains the
// single-process reference itself, then takes part in the parallel run of
// the same recipe; the loss at every step, the gradient norm and the whole
// weights after the last step (gathered from the ranks' pieces) must agree
// within a relative 1e-5 in f32. The differences are only the order of
// additions: the row-parallel layers' partial products summed across ranks,
// the vocabulary's cross-entropy statistics combined from shards, the
// sequence-parallel norms' and the tied embedding's gradients summed across
// ranks, the gradient norm summed by pieces.
//
// Run with 2 ranks (TP2, TP2 + SP, PP2, reshards; DeepSeek's latent
// attention under TP2), 4 (TP4 with grouped-query
// attention, DP2 × TP2, PP4 with an uneven split, TP2 × PP2, DP2 × PP2,
// the distributed optimizer (ZeRO-1) under DP2 × TP2 and DP2 × PP2 (tied,
// interleaved, bf16 masters), FSDP under DP2 × TP2 (with SP, bf16 masters)
// and DP2 × PP2 (tied, interleaved with full recompute, bf16 masters),
// reshards) and 8 (DP2 × TP2 × PP2, and with ZeRO-1 and with FSDP).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "ckpt/safetensors.h"
#include "core/rng.h"
#include "equivalence_util.h"
#include "nn/cross_entropy.h"
#include "ops/ops.h"
#include "parallel/model_parallel.h"
#include "parallel/pipeline_parallel.h"
#include "parallel_env.h"
#include "train/trainer.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using test::mpi;

// Relative tolerances in f32. Losses and gradient norms: 1e-5 at every
// step, as the data-parallel tests; the gradients of the first step (the
// same weights on both sides), per tensor in the 2-norm: 1e-5. The weights
// after ten steps: 1e-3. Adam scales each element's gradient by its own
// running magnitude, so an element whose gradient is near zero (about
// Adam's eps) takes a step whose size depends on the rounding of that
// gradient, up to lr (3e-3) either way: measured, single elements of
// 5e-6 after one step and tensors at 5e-5 relative after ten under
// TP2 x PP2 (below 1e-5 with one kind of parallelism alone).
constexpr double kF32 = 1e-5, kTenSteps = 1e-3;

struct Recipe {
  std::string preset;
  int tp = 2;
  bool sp = false;
  int64_t accum = 1;  // micro-batches per data-parallel rank per step
  int64_t n_head = 4, n_kv_head = 2;
  std::vector<std::string> extra = {};
  int pp = 1;
  int64_t n_layer = 2;
  // 264: the bytes padded to a multiple of 8; under tp the layout pads it
  // further (model.make_vocab_size_divisible_by).
  int64_t vocab = 264;
};

Recipe recipe(const std::string& preset, int tp = 2, bool sp = false, int64_t accum = 1,
              int64_t n_head = 4, int64_t n_kv_head = 2, std::vector<std::string> extra = {}) {
  return {preset, tp, sp, accum, n_head, n_kv_head, std::move(extra)};
}
// A pipelined recipe: pp stages of a 4-layer model (tp ranks each).
Recipe pipelined(const std::string& preset, int pp, int tp = 1, bool sp = false, int64_t accum = 4,
                 std::vector<std::string> extra = {}) {
  Recipe r = recipe(preset, tp, sp, accum, 8, 4, std::move(extra));
  r.pp = pp;
  r.n_layer = 4;
  return r;
}

class TensorParallel : public test::RankTest {
 protected:
  void SetUp() override { set_up("tensor_parallel_mpi"); }

  // The recipe for a world of `dp` data-parallel replicas of tp × pp ranks
  // each (dp = tp = pp = 1: the single-process reference).
  TrainConfig config(const Recipe& r, const std::string& out, int tp, int pp, int64_t dp,
                     const std::vector<std::string>& extra = {}) {
    const int64_t B = 2;
    std::vector<std::string> o = {
        "model.preset=" + r.preset,
        "model.n_layer=" + std::to_string(r.n_layer),
        "model.d_model=64",
        "model.n_head=" + std::to_string(r.n_head),
        "model.d_ff=128",
        "model.vocab_size=" + std::to_string(r.vocab),
        "train.val_every=0",
        "train.grad_clip=1.0",
        "train.out_dir=" + out,
        "train.dtype=f32",
        "parallel.tp=" + std::to_string(tp),
        "parallel.pp=" + std::to_string(pp),
        std::string("parallel.sp=") + (r.sp && tp > 1 ? "true" : "false")};
    for (std::string& c : common_options(B, B * r.accum * dp)) o.push_back(std::move(c));
    if (r.preset == "llama-tiny") o.push_back("model.n_kv_head=" + std::to_string(r.n_kv_head));
    const bool one_process = tp == 1 && pp == 1;  // the reference: no parallel.* extras
    for (const std::string& e : r.extra) {
      const bool pipeline_only =
          e.starts_with("parallel.vp=") || e.starts_with("parallel.pp_layout=");
      if ((one_process && e.starts_with("parallel.")) || (pp == 1 && pipeline_only)) continue;
      o.push_back(e);
    }
    o.insert(o.end(), extra.begin(), extra.end());
    ConfigSchema s = train_schema();
    return train_config_from(Config::load(s, "", o));
  }

  // The mesh and groups of a run of the layout `cfg` names over the world.
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

  // The whole weights of a (model-parallel) trainer, gathered on every rank.
  static Tensor whole_weights(Trainer& t, const Layout& l) {
    return parallel::gather_model(t.model(), t.model().params(), &l.groups->get("pp"));
  }

  static void expect_same_losses(const Trainer& ref, const Trainer& t, size_t first, double tol,
                                 const std::string& what) {
    ASSERT_EQ(ref.history().size(), first + t.history().size()) << what;
    for (size_t i = 0; i < t.history().size(); ++i) {
      const StepStats &a = ref.history()[first + i], &b = t.history()[i];
      EXPECT_LE(std::abs(a.loss - b.loss), tol * std::abs(a.loss))
          << what << " step " << a.step << ": " << a.loss << " vs " << b.loss;
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 10 * tol * a.grad_norm) << what << " step " << a.step;
      EXPECT_EQ(std::isnan(a.val_loss), std::isnan(b.val_loss)) << what << " step " << a.step;
      if (!std::isnan(a.val_loss)) {
        EXPECT_LE(std::abs(a.val_loss - b.val_loss), tol * std::abs(a.val_loss))
            << what << " validation at step " << a.step;
      }
    }
  }

  // Trains `r` on one process and under tp × pp × (world / (tp pp)), and compares.
  void check(const Recipe& r) {
    ASSERT_EQ(world_ % (r.tp * r.pp), 0);
    const int64_t dp = world_ / (r.tp * r.pp);
    Trainer ref(config(r, (base_ / ("ref_rank" + std::to_string(rank_))).string(), 1, 1, dp));
    Tensor ref_grads, mp_grads;  // the first step's gradients (whole model)
    ref.run([&](const StepStats& s) {
      if (s.step != 1) return;
      ref_grads = Tensor::empty(ref.model().grads().shape(), DType::F32);
      ops::convert(ref_grads, ref.model().grads());
    });
    const TrainConfig cfg = config(r, (base_ / "mp").string(), r.tp, r.pp, dp);
    Layout l = layout(cfg);
    Trainer t(cfg, l.par());
    EXPECT_LT(t.model().layout().count(), ref.model().layout().count()) << "not split";
    t.run([&](const StepStats& s) {
      if (s.step == 1)
        mp_grads = parallel::gather_model(t.model(), t.model().grads(), &l.groups->get("pp"));
    });
    ASSERT_EQ(ref.history().size(), 10u);
    expect_same_losses(ref, t, 0, kF32, "parallel");
    // (A distributed optimizer's rank holds only its blocks of the summed
    // gradient, the rest is scratch: there the gradient norms above check it.)
    const bool zero =
        std::find(r.extra.begin(), r.extra.end(), "parallel.shard=optimizer") != r.extra.end() ||
        std::find(r.extra.begin(), r.extra.end(), "parallel.shard=full") != r.extra.end();
    if (!zero)
      test::expect_weights_close(ref.model().layout(), ref_grads, mp_grads, kF32,
                                 "gradient of step 1: ");
    test::expect_weights_close(ref.model().layout(), ref.model().params(), whole_weights(t, l),
                               kTenSteps, "after step 10: ");
    // Rank 0 exported the whole model and the last checkpoint, holding the
    // vocabulary's rows and no padding.
    barrier();
    if (rank_ == 0) {
      EXPECT_TRUE(fs::exists(base_ / "mp" / "model" / "model.safetensors"));
      EXPECT_TRUE(fs::exists(base_ / "mp" / "checkpoints" / "step_00000010" / "manifest.json"));
      expect_vocab_rows((base_ / "mp" / "model" / "model.safetensors").string(), r.vocab);
      if (!zero)  // (a distributed optimizer's checkpoint may hold the weights in pieces)
        expect_vocab_rows(
            (base_ / "mp" / "checkpoints" / "step_00000010" / "model.safetensors").string(),
            r.vocab);
    }
  }

  // The token table (and an untied head) in `file` have `vocab` rows.
  static void expect_vocab_rows(const std::string& file, int64_t vocab) {
    ASSERT_TRUE(fs::exists(file)) << file;
    SafetensorsFile f = SafetensorsFile::open(file);
    for (const char* name : {"wte", "lm_head.weight"}) {
      if (!f.has(name)) continue;
      EXPECT_EQ(f.entry(name).shape[0], vocab) << file << " " << name;
    }
  }

  // Resharding: `r` trained for 10 steps under layout `from` (tp, pp over
  // the world), and again stopped after step 5; the checkpoint resumed
  // under the same layout continues bit for bit, and under each layout of
  // `to` ({1, 1}: every rank on its own) within 1e-5.
  void reshard(const Recipe& r, std::pair<int, int> from,
               const std::vector<std::pair<int, int>>& to) {
    const auto dp_of = [&](std::pair<int, int> lay) { return world_ / (lay.first * lay.second); };
    const TrainConfig whole_cfg =
        config(r, (base_ / "whole").string(), from.first, from.second, dp_of(from));
    Layout l = layout(whole_cfg);
    Trainer whole(whole_cfg, l.par());
    whole.run();
    {
      Trainer first(config(r, (base_ / "split").string(), from.first, from.second, dp_of(from),
                           {"train.exit_at_step=5"}),
                    l.par());
      first.run();
    }
    barrier();
    const std::string ckpt = (base_ / "split" / "checkpoints" / "step_00000005").string();
    {  // the same layout: bit for bit
      Trainer again(config(r, (base_ / "split").string(), from.first, from.second, dp_of(from)),
                    l.par());
      ASSERT_EQ(again.state().step, 5);
      again.run();
      ASSERT_EQ(again.history().size(), 5u);
      for (size_t i = 0; i < 5; ++i)
        EXPECT_EQ(whole.history()[5 + i].loss, again.history()[i].loss) << "step " << 6 + i;
    }
    for (const auto& lay : to) {
      const std::string what =
          fmt::format("tp{} pp{} -> tp{} pp{}", from.first, from.second, lay.first, lay.second);
      const bool alone = lay.first * lay.second == 1;
      const std::string out = (base_ / fmt::format("to_tp{}_pp{}{}", lay.first, lay.second,
                                                   alone ? "_rank" + std::to_string(rank_) : ""))
                                  .string();
      // Alone: the global batch of the run that saved (its dp).
      // The saving run's global batch, whatever the data-parallel size now.
      const TrainConfig cfg =
          config(r, out, lay.first, lay.second, dp_of(from), {"train.resume_from=" + ckpt});
      if (alone) {
        Trainer one(cfg);
        ASSERT_EQ(one.state().step, 5) << what;
        one.run();
        expect_same_losses(whole, one, 5, kF32, what);
        continue;
      }
      Layout l2 = layout(cfg);
      Trainer t(cfg, l2.par());
      ASSERT_EQ(t.state().step, 5) << what;
      t.run();
      expect_same_losses(whole, t, 5, kF32, what);
    }
    // One process -> `from`: the single-process run stopped at step 5 (on
    // rank 0; the others wait), resumed by every rank.
    const std::string single = (base_ / "single").string();
    if (rank_ == 0) {
      Trainer s(config(r, single, 1, 1, dp_of(from), {"train.exit_at_step=5"}));
      s.run();
    }
    barrier();
    Trainer back(config(r, (base_ / "back").string(), from.first, from.second, dp_of(from),
                        {"train.resume_from=" + single + "/checkpoints/step_00000005"}),
                 l.par());
    ASSERT_EQ(back.state().step, 5);
    back.run();
    expect_same_losses(whole, back, 5, kF32, "1 -> layout");
  }
  // bf16 masters (optim.master_dtype=bf16) of `r` under tp x pp x dp
  // against one process's bf16-master run (see the tests below).
  void bf16_master(const Recipe& r, int tp, int pp, int64_t dp, const std::string& tag) {
    constexpr double kBf16 = 1e-3;
    const std::vector<std::string> bf = {"train.dtype=bf16", "optim.master_dtype=bf16"};
    auto with = [&](std::vector<std::string> o, const std::string& e) {
      o.push_back(e);
      return o;
    };
    const std::string mine = "_rank" + std::to_string(rank_);
    Trainer ref(config(r, (base_ / (tag + "_ref" + mine)).string(), 1, 1, dp, bf));
    ref.run();
    const TrainConfig cfg = config(r, (base_ / tag).string(), tp, pp, dp, bf);
    Layout l = layout(cfg);
    Trainer t(cfg, l.par());
    EXPECT_TRUE(t.optimizer().master_in_compute()) << tag;
    t.run();
    expect_same_losses(ref, t, 0, kBf16, tag);
    const std::string split = (base_ / (tag + "_split")).string();
    {
      Trainer first(config(r, split, tp, pp, dp, with(bf, "train.exit_at_step=5")), l.par());
      first.run();
    }
    barrier();
    Trainer again(config(r, split, tp, pp, dp, bf), l.par());
    ASSERT_EQ(again.state().step, 5) << tag;
    again.run();
    ASSERT_EQ(again.history().size(), 5u) << tag;
    for (size_t i = 0; i < 5; ++i)
      EXPECT_EQ(t.history()[5 + i].loss, again.history()[i].loss) << tag << " step " << 6 + i;
    Trainer one(config(r, (base_ / (tag + "_one" + mine)).string(), 1, 1, dp,
                       with(bf, "train.resume_from=" + split + "/checkpoints/step_00000005")));
    ASSERT_EQ(one.state().step, 5) << tag;
    one.run();
    expect_same_losses(t, one, 5, kBf16, tag + " -> one process");
  }
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
  ce.tp = {&groups_->get("world"), false};
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

// Vocabulary padding: the bytes tokenizer's 257 ids under TP2 (512 rows:
// rank 1 holds id 256 and 255 zero rows) and TP4 (rank 2 holds id 256 alone,
// rank 3 padding only), the head's padding never scored, so the losses and
// weights are one process's (check also reads 257 rows back from the export
// and the checkpoint).
TEST_F(TensorParallel, Gpt2Tp2Vocab257) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  Recipe r = recipe("gpt-tiny");
  r.vocab = 257;
  check(r);
}
TEST_F(TensorParallel, LlamaTp2UntiedSequenceParallelVocab257) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  Recipe r = recipe("llama-tiny", 2, true, 2);
  r.vocab = 257;
  check(r);
}
TEST_F(TensorParallel, LlamaTp4Vocab257) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  Recipe r = recipe("llama-tiny", 4, false, 1, 8, 4);
  r.vocab = 257;
  check(r);
}
// model.make_vocab_size_divisible_by=1: the least padding, 257 -> 258 rows.
TEST_F(TensorParallel, Gpt2Tp2Vocab257DivisibleByOne) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  Recipe r = recipe("gpt-tiny", 2, false, 1, 4, 2, {"model.make_vocab_size_divisible_by=1"});
  r.vocab = 257;
  check(r);
}

// The same over a padded vocabulary (Megatron's layout): 257 ids in shares of
// padded_rows(257, 128, world) / world columns, each rank passing only its
// real columns (fewer than its share on the rank holding id 256, none past
// it: undefined logits), against the plain cross-entropy over the 257
// columns. The padding is no column of the softmax at all.
TEST_F(TensorParallel, VocabCrossEntropyOverAPaddedVocabulary) {
  const int64_t N = 29, real = 257, share = padded_rows(real, 128, world_) / world_;
  Rng rng(8);
  Tensor logits = Tensor::empty({N, real}, DType::F32), targets = Tensor::empty({N}, DType::I32);
  for (int64_t i = 0; i < N * real; ++i) logits.data<float>()[i] = float(3 * rng.normal());
  for (int64_t i = 0; i < N; ++i)
    targets.data<int32_t>()[i] = i % 7 == 2 ? -100 : int32_t(rng.below(uint64_t(real)));
  const float scale = 0.5f;
  Tensor losses = Tensor::empty({N}, DType::F32), dlogits = Tensor::empty({N, real}, DType::F32);
  ops::cross_entropy_forward_backward(losses, dlogits, logits, targets, -100, scale);
  nn::VocabCrossEntropy ce;
  ce.tp = {&groups_->get("world"), false};
  ce.vocab_start = rank_ * share;
  const int64_t cols = std::clamp<int64_t>(real - ce.vocab_start, 0, share);
  Tensor stats = Tensor::empty({nn::VocabCrossEntropy::stats_size(N)}, DType::F32);
  for (bool backward : {false, true}) {
    Tensor mine = cols ? Tensor::empty({N, cols}, DType::F32) : Tensor(),
           l = Tensor::empty({N}, DType::F32);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < cols; ++j)
        mine.data<float>()[i * cols + j] = logits.data<float>()[i * real + ce.vocab_start + j];
    ce.forward(l, mine, targets, backward, scale, stats);
    for (int64_t i = 0; i < N; ++i) {
      const float want = losses.data<float>()[i];
      EXPECT_NEAR(l.data<float>()[i], want, 1e-6 * std::abs(want)) << "row " << i;
    }
    for (int64_t i = 0; backward && i < N; ++i)
      for (int64_t j = 0; j < cols; ++j)
        ASSERT_NEAR(mine.data<float>()[i * cols + j],
                    dlogits.data<float>()[i * real + ce.vocab_start + j],
                    2e-6 * std::abs(dlogits.data<float>()[i * real + ce.vocab_start + j]) + 1e-9)
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

// DeepSeek's Multi-head Latent Attention (with its Mixture of Experts,
// each expert split over tp): q (V2) or q_b (V3, with q_a and its norm) and
// kv_b split by heads, o_proj by columns; kv_a and its norm whole on every
// rank, their gradients (each rank's heads' part) summed over the group.
TEST_F(TensorParallel, DeepseekV2Tp2) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check(recipe("deepseek_v2-tiny"));
}
TEST_F(TensorParallel, DeepseekV3Tp2) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check(recipe("deepseek_v3-tiny"));
}
TEST_F(TensorParallel, DeepseekV3Tp2SequenceParallel) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check(recipe("deepseek_v3-tiny", 2, true));
}
TEST_F(TensorParallel, DeepseekV3Tp4) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(recipe("deepseek_v3-tiny", 4));
}

TEST_F(TensorParallel, Gpt2Pp2TiedEmbeddings) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check(pipelined("gpt-tiny", 2));  // GPT-2 ties its head to the embedding across the stages
}
TEST_F(TensorParallel, LlamaPp2OneMicroBatch) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check(pipelined("llama-tiny", 2, 1, false, 1));
}
TEST_F(TensorParallel, LlamaPp2UnevenLayoutRecompute) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check(pipelined("llama-tiny", 2, 1, false, 3,
                  {"parallel.pp_layout=1,3", "train.recompute=full", "train.val_every=5"}));
}
// The interleaved schedule: 2 virtual stages per rank (a micro-batch
// passes each rank twice; the tied table on rank 0's first chunk and the
// last rank's last chunk).
TEST_F(TensorParallel, Gpt2Pp2Interleaved) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check(pipelined("gpt-tiny", 2, 1, false, 4, {"parallel.vp=2"}));
}
// Interleaved with uneven virtual stages (parallel.pp_layout lists pp × vp
// of them): the last rank's last chunk holds no layer, only the head.
TEST_F(TensorParallel, Gpt2Pp2InterleavedUneven) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check(pipelined("gpt-tiny", 2, 1, false, 4, {"parallel.vp=2", "parallel.pp_layout=2,1,1,0"}));
}
TEST_F(TensorParallel, LlamaPp2InterleavedMicroBatchesEqualStages) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check(pipelined("llama-tiny", 2, 1, false, 2, {"parallel.vp=2", "train.val_every=5"}));
}
TEST_F(TensorParallel, LlamaPp4Interleaved) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  Recipe r = pipelined("llama-tiny", 4, 1, false, 8, {"parallel.vp=2"});
  r.n_layer = 8;
  check(r);
}
TEST_F(TensorParallel, LlamaPp4InterleavedUnevenFullRecompute) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  Recipe r =
      pipelined("llama-tiny", 4, 1, false, 8,
                {"parallel.vp=2", "parallel.pp_layout=2,1,1,1,1,1,1,0", "train.recompute=full"});
  r.n_layer = 8;
  check(r);
}
TEST_F(TensorParallel, Gpt2Tp2Pp2Interleaved) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(pipelined("gpt-tiny", 2, 2, true, 4, {"parallel.vp=2"}));
}
TEST_F(TensorParallel, Gpt2Pp4EmbeddingOnlyFirstStage) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(pipelined("gpt-tiny", 4, 1, false, 6, {"parallel.pp_layout=0,2,1,1"}));
}
TEST_F(TensorParallel, LlamaTp2Pp2SequenceParallel) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(pipelined("llama-tiny", 2, 2, true));
}
// The distributed optimizer (ZeRO-1) over the data-parallel replicas of a
// tensor-parallel model.
TEST_F(TensorParallel, Gpt2Dp2Zero1Tp2) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(recipe("gpt-tiny", 2, false, 2, 4, 2, {"parallel.shard=optimizer"}));
}
TEST_F(TensorParallel, LlamaDp2Zero1Tp2SequenceParallel) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(recipe("llama-tiny", 2, true, 1, 4, 2, {"parallel.shard=optimizer"}));
}
// FSDP over the data-parallel replicas of a tensor-parallel model: each
// rank's pieces sharded over its replicas, gathered unit by unit.
TEST_F(TensorParallel, Gpt2Dp2FsdpTp2) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(recipe("gpt-tiny", 2, false, 2, 4, 2, {"parallel.shard=full"}));
}
TEST_F(TensorParallel, LlamaDp2FsdpTp2SequenceParallel) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(recipe("llama-tiny", 2, true, 1, 4, 2, {"parallel.shard=full"}));
}
TEST_F(TensorParallel, Gpt2Tp2Pp2) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(pipelined("gpt-tiny", 2, 2, false));
}
TEST_F(TensorParallel, Gpt2Dp2Pp2) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(pipelined("gpt-tiny", 2, 1, false, 2));
}
TEST_F(TensorParallel, LlamaDp2Tp2Pp2) {
  if (world_ != 8) GTEST_SKIP() << "8 ranks";
  check(pipelined("llama-tiny", 2, 2, true, 2));
}
TEST_F(TensorParallel, Gpt2Dp2Tp2Pp2) {
  if (world_ != 8) GTEST_SKIP() << "8 ranks";
  check(pipelined("gpt-tiny", 2, 2, false, 2));
}
// The distributed optimizer (ZeRO-1) over the data-parallel replicas of a
// pipelined model: each stage's gradients reduce-scattered over its
// replicas after the schedule, each rank's optimizer its blocks of its
// stage, the updated weights gathered before the next schedule. GPT-2's
// tied table: its two stages' copies summed before the reduce-scatter, so
// each stage's owners update their blocks of it alike.
TEST_F(TensorParallel, Gpt2Dp2Zero1Pp2TiedEmbeddings) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(pipelined("gpt-tiny", 2, 1, false, 2, {"parallel.shard=optimizer"}));
}
TEST_F(TensorParallel, LlamaDp2Zero1Pp2Interleaved) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(pipelined("llama-tiny", 2, 1, false, 4, {"parallel.shard=optimizer", "parallel.vp=2"}));
}
TEST_F(TensorParallel, LlamaDp2Zero1Tp2Pp2) {
  if (world_ != 8) GTEST_SKIP() << "8 ranks";
  check(pipelined("llama-tiny", 2, 2, true, 2, {"parallel.shard=optimizer"}));
}
// FSDP under pipelining: each chunk's units gathered over the stage's
// replicas before each of its forwards and backwards and released after,
// the gradients reduce-scattered once the schedule has run. GPT-2's tied
// table: each stage's copy sharded over its own replicas.
// FSDP's gathers as the schedule asks for them: a layer made resident that
// was not (nothing is released: the weights stay whole).
class CountingChunkWeights : public parallel::ChunkWeights {
 public:
  explicit CountingChunkWeights(int64_t n_layer) : resident_(size_t(n_layer), false) {}
  void use_chunk(int64_t first, int64_t last, bool, bool) override {
    for (int64_t l = first; l < last; ++l)
      if (!resident_[size_t(l)]) resident_[size_t(l)] = true, ++gathers;
  }
  void done_chunk(int64_t first, int64_t last, bool, bool) override {
    for (int64_t l = first; l < last; ++l) resident_[size_t(l)] = false;
  }
  int64_t gathers = 0;

 private:
  std::vector<bool> resident_;
};

// Under FSDP every chunk's layers are gathered for its forward and again for
// its backward, but the model's last chunk, whose backward the schedule runs
// right after its forward (with the head's): once a micro-batch. PP2, 1F1B
// and interleaved (vp 2), 4 micro-batches of a 4-layer model.
TEST_F(TensorParallel, PipelineGathersTheLastChunkOnceAMicroBatch) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  ModelConfig cfg = model_preset("llama-tiny");
  cfg.n_layer = 4, cfg.d_model = 64, cfg.n_head = 4, cfg.n_kv_head = 2, cfg.d_ff = 128;
  cfg.vocab_size = 264;
  const int64_t B = 2, T = 16, m = 4;
  std::vector<Tensor> tokens, targets;
  Rng rng(7);
  for (int64_t j = 0; j < m; ++j) {
    tokens.push_back(Tensor::empty({B, T}, DType::I32));
    targets.push_back(Tensor::empty({B, T}, DType::I32));
    for (int64_t i = 0; i < B * T; ++i) {
      tokens.back().data<int32_t>()[i] = int32_t(rng.next_u64() % 264);
      targets.back().data<int32_t>()[i] = int32_t(rng.next_u64() % 264);
    }
  }
  for (int64_t vp : {1, 2}) {
    const PipelineStage st = parallel::pipeline_stage(cfg, 2, rank_, {}, vp);
    Transformer model(cfg, DType::F32, 5, ParamInit::Random, {}, kHost, FrozenWeights::Master,
                      QuantPlan(), nn::TensorParallel{}, st);
    parallel::PipelineParallel pipe(model, groups_->get("world"), nullptr, B, T,
                                    std::vector<Recompute>(4, Recompute::None));
    CountingChunkWeights w(cfg.n_layer);
    pipe.set_chunk_weights(&w);
    model.zero_grads();
    pipe.forward_backward(tokens, targets, 1.f / float(m));
    int64_t want = 0;
    const auto ranges = st.ranges(cfg);
    for (size_t c = 0; c < ranges.size(); ++c) {
      const bool model_last = rank_ == 1 && c + 1 == ranges.size();
      want += (ranges[c].second - ranges[c].first) * m * (model_last ? 1 : 2);
    }
    EXPECT_EQ(w.gathers, want) << "rank " << rank_ << ", vp " << vp;
  }
}

TEST_F(TensorParallel, Gpt2Dp2FsdpPp2TiedEmbeddings) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(pipelined("gpt-tiny", 2, 1, false, 2, {"parallel.shard=full"}));
}
TEST_F(TensorParallel, LlamaDp2FsdpPp2InterleavedFullRecompute) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(pipelined("llama-tiny", 2, 1, false, 4,
                  {"parallel.shard=full", "parallel.vp=2", "train.recompute=full"}));
}
TEST_F(TensorParallel, LlamaDp2FsdpTp2Pp2) {
  if (world_ != 8) GTEST_SKIP() << "8 ranks";
  check(pipelined("llama-tiny", 2, 2, true, 2, {"parallel.shard=full"}));
}

// bf16 gradients are not under tensor or pipeline parallelism yet: refused
// with the key and the layout named.
TEST_F(TensorParallel, Bf16GradientsAreRefused) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  for (const auto& [tp, pp] : {std::pair{2, 1}, std::pair{1, 2}}) {
    const Recipe r = pp > 1 ? pipelined("gpt-tiny", pp) : recipe("gpt-tiny", tp);
    const TrainConfig cfg = config(r, (base_ / "refused").string(), tp, pp, 1,
                                   {"train.dtype=bf16", "optim.grad_dtype=bf16"});
    Layout l = layout(cfg);
    std::string err;
    try {
      Trainer t(cfg, l.par());
    } catch (const Error& e) {
      err = e.what();
    }
    EXPECT_NE(err.find("optim.grad_dtype=bf16 runs without tensor and pipeline parallelism"),
              std::string::npos)
        << "tp " << tp << ": " << err;
  }
}

// bf16 masters (optim.master_dtype=bf16: the bf16 weights and a 16-bit
// remainder, no f32 arena) under TP2 and PP2: each rank updates its own
// pieces and lends them as f32 to a checkpoint's gathers. Every step's loss
// within 1e-3 (relative) of one process's bf16-master run, as the bf16
// data-parallel checks (the bf16 products round in another grouping); a
// checkpoint of step 5 resumes under the same layout bit for bit, and on
// one process within the same 1e-3.
TEST_F(TensorParallel, Bf16MasterUnderTensorAndPipelineParallelism) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  bf16_master(recipe("llama-tiny", 2, true), 2, 1, 1, "bf16master_tp2_pp1");
  bf16_master(pipelined("llama-tiny", 2), 1, 2, 1, "bf16master_tp1_pp2");
}
// The same under DP2 x PP2 with the distributed optimizer: each rank's
// optimizer keeps the remainders of its blocks of its stage.
TEST_F(TensorParallel, Bf16MasterUnderZero1AndPipelineParallelism) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  bf16_master(pipelined("llama-tiny", 2, 1, false, 2, {"parallel.shard=optimizer"}), 1, 2, 2,
              "bf16master_dp2_zero1_pp2");
}
// And under DP2 x TP2 with FSDP: the gathered units are the bf16 weights,
// each rank's optimizer the remainders of its blocks of its pieces.
TEST_F(TensorParallel, Bf16MasterUnderFsdpAndTensorParallelism) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  bf16_master(recipe("llama-tiny", 2, true, 1, 4, 2, {"parallel.shard=full"}), 2, 1, 2,
              "bf16master_dp2_fsdp_tp2");
}
TEST_F(TensorParallel, Bf16MasterUnderFsdpAndPipelineParallelism) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  bf16_master(pipelined("llama-tiny", 2, 1, false, 2, {"parallel.shard=full"}), 1, 2, 2,
              "bf16master_dp2_fsdp_pp2");
}

// Resharding: a checkpoint saved under one layout resumes under others on
// the unbroken run's losses.
TEST_F(TensorParallel, ReshardTensorParallel) {
  if (world_ > 4) GTEST_SKIP() << "2 or 4 ranks";
  reshard(recipe("llama-tiny", world_, true, 1, 8, 4), {world_, 1}, {{1, 1}});
}
// A padded vocabulary's checkpoint holds its 257 rows: TP2 (or TP4) resumes
// at one process and one process at TP2 (or TP4), on the unbroken run.
TEST_F(TensorParallel, ReshardTensorParallelVocab257) {
  if (world_ > 4) GTEST_SKIP() << "2 or 4 ranks";
  Recipe r = recipe("llama-tiny", world_, false, 1, 8, 4);
  r.vocab = 257;
  reshard(r, {world_, 1}, {{1, 1}});
}
// MLA's checkpoint under TP2 resumes on one process, and back.
TEST_F(TensorParallel, ReshardDeepseekV3Tp2) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  reshard(recipe("deepseek_v3-tiny"), {2, 1}, {{1, 1}});
}
TEST_F(TensorParallel, ReshardPipeline) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  reshard(pipelined("gpt-tiny", 2), {1, 2}, {{1, 1}, {2, 1}});
}
TEST_F(TensorParallel, ReshardDp2Zero1Tp2) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  reshard(recipe("llama-tiny", 2, true, 1, 8, 4, {"parallel.shard=optimizer"}), {2, 1},
          {{1, 1}, {4, 1}});
}
// A DP2 x PP2 ZeRO-1 checkpoint (saved whole, the moments joined from the
// replicas' blocks) resumes on one process, under TP2 x DP2 ZeRO-1 and PP4.
TEST_F(TensorParallel, ReshardDp2Zero1Pp2) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  reshard(pipelined("llama-tiny", 2, 1, false, 2, {"parallel.shard=optimizer"}), {1, 2},
          {{1, 1}, {2, 1}, {1, 4}});
}
// A DP2 x TP2 FSDP checkpoint (its blocks joined over the replicas, the
// pieces over tp) resumes on one process and under TP4.
TEST_F(TensorParallel, ReshardDp2FsdpTp2) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  reshard(recipe("llama-tiny", 2, true, 1, 8, 4, {"parallel.shard=full"}), {2, 1},
          {{1, 1}, {4, 1}});
}
// A DP2 x PP2 FSDP checkpoint resumes on one process and under PP4.
TEST_F(TensorParallel, ReshardDp2FsdpPp2) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  reshard(pipelined("llama-tiny", 2, 1, false, 2, {"parallel.shard=full"}), {1, 2},
          {{1, 1}, {1, 4}});
}
TEST_F(TensorParallel, ReshardInterleaved) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  reshard(pipelined("llama-tiny", 2, 1, false, 4, {"parallel.vp=2"}), {1, 2}, {{1, 1}, {2, 1}});
}
// Uneven virtual stages (one without layers): resumes on one process and under TP2.
TEST_F(TensorParallel, ReshardInterleavedUneven) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  reshard(pipelined("llama-tiny", 2, 1, false, 4, {"parallel.vp=2", "parallel.pp_layout=1,2,1,0"}),
          {1, 2}, {{1, 1}, {2, 1}});
}
TEST_F(TensorParallel, ReshardTp2Pp2) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  reshard(pipelined("llama-tiny", 2, 2, true), {2, 2}, {{1, 1}, {1, 4}, {4, 1}});
}

}  // namespace
}  // namespace nk
