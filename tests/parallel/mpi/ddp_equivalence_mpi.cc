// Data parallel against one process (shared/DESIGN.md: every parallel feature
// has an equivalence test). Each rank trains the single-process reference
// itself, then takes part in the data-parallel run of the same recipe; the
// loss at every step and the weights after the last must agree within a
// relative 1e-5 in f32. The differences are only the order of additions: the
// ranks' partial gradients are summed across ranks instead of one after
// another, and the loss is summed in f64 the same way.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "ckpt/model_io.h"
#include "equivalence_util.h"
#include "parallel/sharded_weights.h"
#include "parallel_env.h"
#include "sharded_masters.h"
#include "train/trainer.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using test::mpi;

struct Recipe {
  std::string preset;
  DType dtype = DType::F32;
  int64_t accum = 1;  // micro-batches per rank per step
  bool overlap = true;
  double bucket_mb = 0.02;      // small: several buckets on the tiny models
  std::string shard = "none";   // parallel.shard
  int64_t val_every = 0;        // train.val_every (validation through the DP layer)
  std::string freeze = "";      // train.freeze
  std::string moments = "f32";  // optim.moment_dtype
  std::string master = "f32";   // optim.master_dtype
  std::string grads = "f32";    // optim.grad_dtype
};

class DataParallel : public test::RankTest {
 protected:
  void SetUp() override { set_up("parallel_mpi"); }

  TrainConfig config(const Recipe& r, const std::string& out, int64_t dp,
                     const std::vector<std::string>& extra = {}) {
    const int64_t B = 2;
    std::vector<std::string> o = {
        "model.preset=" + r.preset,
        "model.n_layer=2",
        "model.d_model=64",
        "model.n_head=4",
        "model.d_ff=128",
        "train.val_every=" + std::to_string(r.val_every),
        "train.val_batches=2",
        "train.out_dir=" + out,
        std::string("train.dtype=") + dtype_name(r.dtype),
        "parallel.bucket_mb=" + std::to_string(r.bucket_mb),
        std::string("parallel.overlap_grad_reduce=") + (r.overlap ? "true" : "false"),
        "parallel.shard=" + r.shard,
        "optim.moment_dtype=" + r.moments,
        "optim.master_dtype=" + r.master,
        "optim.grad_dtype=" + r.grads};
    for (std::string& c : common_options(B, B * r.accum * dp)) o.push_back(std::move(c));
    if (r.preset == "llama-tiny") o.push_back("model.n_kv_head=2");
    if (!r.freeze.empty()) o.push_back("train.freeze=" + r.freeze);
    o.insert(o.end(), extra.begin(), extra.end());
    ConfigSchema s = train_schema();
    return train_config_from(Config::load(s, "", o));
  }

  // The batches a trainer reads, per step, in order.
  using Batches = std::vector<std::vector<std::vector<int32_t>>>;
  static void record(Trainer& t, Batches& into) {
    t.set_batch_observer([&into](int64_t step, const Tensor& x, const Tensor&) {
      if (int64_t(into.size()) < step) into.resize(size_t(step));
      into[size_t(step - 1)].emplace_back(x.data<int32_t>(), x.data<int32_t>() + x.numel());
    });
  }

  // Trains `r` on one process and on every rank of the world, and compares.
  void check(const Recipe& r, double loss_tol, double param_tol) {
    const int64_t dp = world_;
    Trainer ref(config(r, (base_ / ("ref_rank" + std::to_string(rank_))).string(), dp));
    Batches ref_batches, dp_batches;
    record(ref, ref_batches);
    ref.run();
    dist::Mesh mesh = train_mesh(config(r, "unused", dp), world_, rank_);
    TrainParallel par{&mesh, groups_.get()};
    Trainer ddp(config(r, (base_ / "dp").string(), dp), par);
    record(ddp, dp_batches);
    // Between steps only this rank's blocks of the sharded weights are
    // resident (plus the pages a block shares with a neighbour): under FSDP
    // the compute weights and the f32 master, under ZeRO-1 with bf16 compute
    // the master.
    // Sharded gradients (ZeRO-2, FSDP): between steps this rank's blocks of
    // the gradients; during a step at most those, the stage being computed
    // and the buckets on their way.
    std::vector<size_t> compute_resident, master_resident, grad_resident, grad_peak;
    ddp.run([&](const StepStats& s) {
      compute_resident.push_back(parallel::resident_bytes(ddp.model().compute_params()));
      master_resident.push_back(parallel::resident_bytes(ddp.model().params()));
      grad_resident.push_back(parallel::resident_bytes(ddp.model().grads()));
      grad_peak.push_back(s.grad_resident_bytes);
    });
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t buckets =
        parallel::plan_grad_buckets(ddp.model().layout(), ddp.model().config().n_layer,
                                    int64_t(r.bucket_mb * 262144), true)
            .size();
    // Frozen parameters (after the trainable ones) stay whole.
    const ParamLayout& layout = ddp.model().layout();
    auto expect_sharded = [&](const std::vector<size_t>& resident, const Tensor& arena,
                              const char* what) {
      const size_t es = dtype_size(arena.dtype());
      const size_t bound = size_t(layout.trainable_end()) * es / size_t(dp) +
                           size_t(layout.total() - layout.trainable_end()) * es +
                           2 * page * buckets * size_t(dp) + page;
      for (size_t k = 0; k < resident.size(); ++k)
        EXPECT_LE(resident[k], bound) << what << " step " << k + 1 << ": " << resident[k] << " of "
                                      << arena.nbytes() << " bytes resident";
    };
    if (r.shard == "full")
      expect_sharded(compute_resident, ddp.model().compute_params(), "weights");
    if (r.shard == "full" || (r.shard != "none" && r.dtype == DType::BF16))
      expect_sharded(master_resident, ddp.model().params(), "f32 master");
    if (r.shard == "grads" || r.shard == "full") {
      const Tensor grads = ddp.model().grads();
      expect_sharded(grad_resident, grads, "gradients");
      // The peak: this rank's blocks, the largest backward stage (the
      // embeddings' or the head's table), and what the reductions still
      // hold: a bucket (one each micro-batch with overlap, every one
      // without, as then they start after the backward).
      const size_t es = dtype_size(grads.dtype());
      int64_t largest = 0;
      for (const ParamInfo& p : layout.params())
        if (p.trainable) largest = std::max(largest, p.numel());
      const size_t in_flight =
          r.overlap ? size_t(r.bucket_mb * 1048576) * 2 : size_t(layout.trainable_end()) * es;
      const size_t bound = size_t(layout.trainable_end()) * es / size_t(dp) + size_t(largest) * es +
                           in_flight + 2 * page * buckets * size_t(dp) + page;
      for (size_t k = 0; k < grad_peak.size(); ++k) {
        EXPECT_GT(grad_peak[k], 0u) << "step " << k + 1;
        EXPECT_LE(grad_peak[k], bound) << "step " << k + 1 << ": at most " << grad_peak[k] << " of "
                                       << grads.nbytes() << " gradient bytes resident";
      }
      if (rank_ == 0)
        std::printf("gradients resident: %zu between steps, at most %zu in step 1, of %zu\n",
                    grad_resident[0], grad_peak[0], grads.nbytes());
    } else {
      for (size_t k = 0; k < grad_peak.size(); ++k) EXPECT_EQ(grad_peak[k], 0u);
    }

    ASSERT_EQ(ref.history().size(), 10u);
    ASSERT_EQ(ddp.history().size(), 10u);
    for (size_t i = 0; i < 10; ++i) {
      double a = ref.history()[i].loss, b = ddp.history()[i].loss;
      EXPECT_LE(std::abs(a - b), loss_tol * std::abs(a))
          << "step " << i + 1 << ": " << a << " vs " << b;
      EXPECT_NEAR(ref.history()[i].grad_norm, ddp.history()[i].grad_norm,
                  loss_tol * 10 * ref.history()[i].grad_norm)
          << "step " << i + 1;
      double va = ref.history()[i].val_loss, vb = ddp.history()[i].val_loss;
      EXPECT_EQ(std::isnan(va), std::isnan(vb)) << "step " << i + 1;
      if (!std::isnan(va)) {
        EXPECT_LE(std::abs(va - vb), loss_tol * std::abs(va)) << "step " << i + 1;
      }
    }
    // Rank r's local micro-batch m is the single process's micro-batch m·dp + r.
    for (size_t s = 0; s < 10; ++s) {
      ASSERT_EQ(dp_batches[s].size(), size_t(r.accum));
      for (int64_t m = 0; m < r.accum; ++m)
        EXPECT_EQ(dp_batches[s][size_t(m)], ref_batches[s][size_t(m * dp + rank_)])
            << "step " << s + 1 << " micro-batch " << m;
    }
    // The weights: per tensor (or fused part), the relative difference in the 2-norm.
    // A bf16 master lives in the optimizer: the f32 arena is freed, on both.
    if (r.master == "bf16") {
      EXPECT_EQ(ref.model().params().numel(), 0);
      EXPECT_EQ(ddp.model().params().numel(), 0);
    }
    // bf16 gradients round at other points here (each rank's micro-batches,
    // then the sum over ranks) than in one process: the weights may differ by
    // as much as that rounding moves them at all, measured as one process
    // with f32 gradients against one with bf16 ones, twice that at most.
    if (r.grads == "bf16") {
      Recipe f32 = r;
      f32.grads = "f32";
      Trainer exact(config(f32, (base_ / ("f32_rank" + std::to_string(rank_))).string(), dp));
      exact.run();
      const double rounding = test::max_weight_distance(
          ref.model().layout(), exact.optimizer().masters_f32(), ref.optimizer().masters_f32());
      std::printf("bf16 gradients move the weights by up to %.4f (relative 2-norm)\n", rounding);
      param_tol = std::max(param_tol, 2 * rounding);
    }
    test::expect_weights_close(ref.model().layout(), ref.optimizer().masters_f32(),
                               whole_masters(ddp), param_tol);
    EXPECT_EQ(ddp.state().consumed_samples, ref.state().consumed_samples);
    // ZeRO-1: this rank holds the moments of its blocks only, and the blocks
    // of all ranks add up to the whole state of one process.
    const int64_t whole = ref.optimizer().state_size();
    Tensor held = Tensor::empty({1}, DType::I64);
    *held.data<int64_t>() = ddp.optimizer().state_size();
    groups_->get("world").all_reduce(held);
    if (r.shard != "none") {
      EXPECT_EQ(*held.data<int64_t>(), whole);
      EXPECT_LE(ddp.optimizer().state_size(), whole / dp + 64 * dp) << "not about 1/dp";
    } else {
      EXPECT_EQ(ddp.optimizer().state_size(), whole);
    }
    // Only rank 0 writes the run's files.
    groups_->get("world").barrier();
    if (rank_ == 0) {
      EXPECT_TRUE(fs::exists(base_ / "dp" / "metrics.jsonl"));
      EXPECT_TRUE(fs::exists(base_ / "dp" / "model" / "model.safetensors"));
    }
    // The exported model is the exact f32 master, every rank's blocks of it
    // under ZeRO-1 with a bf16 master.
    const Tensor want = whole_masters(ddp);
    if (rank_ == 0 && r.master == "bf16") {
      auto exported = load_model((base_ / "dp" / "model").string(), DType::F32);
      const Tensor& got = exported->params();
      ASSERT_EQ(got.numel(), want.numel());
      EXPECT_EQ(std::memcmp(got.data<float>(), want.data<float>(), size_t(got.numel()) * 4), 0);
    }
  }

  Tensor whole_masters(const Trainer& t) { return test::whole_masters(t, groups_->get("world")); }

  static Recipe with_shard(Recipe r, const std::string& shard) {
    r.shard = shard;
    return r;
  }
  // A folder of this rank's own (for single-process runs on every rank).
  std::string rank_dir(const std::string& name) const {
    return (base_ / (name + "_rank" + std::to_string(rank_))).string();
  }

  // `r` on every rank, 10 steps straight (returned) and again in
  // base_/split, stopped after step 5 (its checkpoint: split_checkpoint()).
  std::unique_ptr<Trainer> whole_and_split(const Recipe& r, TrainParallel par) {
    auto whole = std::make_unique<Trainer>(config(r, (base_ / "whole").string(), world_), par);
    whole->run();
    {
      Trainer first(config(r, (base_ / "split").string(), world_, {"train.exit_at_step=5"}), par);
      first.run();
    }
    groups_->get("world").barrier();  // the checkpoint is installed
    return whole;
  }
  fs::path split_checkpoint() const { return base_ / "split" / "checkpoints" / "step_00000005"; }

  // Runs `t`, resumed at step 5, and compares steps 6-10 with `whole`'s:
  // bit for bit, weights included (tol 0), or the loss within `tol` relative.
  static void expect_continues(Trainer& whole, Trainer& t, double tol, const std::string& what) {
    EXPECT_EQ(t.state().step, 5) << what;
    t.run();
    ASSERT_EQ(t.history().size(), 5u) << what;
    for (size_t i = 0; i < 5; ++i) {
      double a = whole.history()[5 + i].loss, b = t.history()[i].loss;
      if (tol == 0) {
        EXPECT_EQ(a, b) << what << " step " << 6 + i;
      } else {
        EXPECT_LE(std::abs(a - b), tol * std::abs(a)) << what << " step " << 6 + i;
      }
    }
    if (tol == 0) {  // this rank's masters (the exact ones of its blocks under ZeRO-1)
      const Tensor a = whole.optimizer().masters_f32(), b = t.optimizer().masters_f32();
      ASSERT_EQ(a.numel(), b.numel()) << what;
      EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), size_t(a.numel()) * 4), 0) << what;
    }
  }

  void check_weight_pieces_resume(const Recipe& r, double tol, const std::string& what) {
    const int64_t dp = world_;
    dist::Mesh mesh = train_mesh(config(r, "unused", dp), world_, rank_);
    TrainParallel par{&mesh, groups_.get()};
    auto whole = whole_and_split(r, par);
    const fs::path ckpt = split_checkpoint();
    if (rank_ == 0) {
      for (int64_t k = 0; k < dp; ++k)
        EXPECT_TRUE(fs::exists(ckpt / fmt::format("model.{:05d}-of-{:05d}.safetensors", k, dp)));
      EXPECT_FALSE(fs::exists(ckpt / "model.safetensors"));
    }
    {
      Trainer second(config(r, (base_ / "split").string(), dp), par);
      expect_continues(*whole, second, 0, what + " -> " + what);
    }
    Trainer single(config(with_shard(r, "none"), rank_dir("single"), dp,
                          {"train.resume_from=" + ckpt.string()}));
    expect_continues(*whole, single, tol, what + " -> one process");
  }
};

constexpr double kF32 = 1e-5;

TEST_F(DataParallel, Gpt2) {
  check({"gpt-tiny"}, kF32, kF32);
}
TEST_F(DataParallel, Gpt2GradAccumulation) {
  check({"gpt-tiny", DType::F32, 2}, kF32, kF32);
}
TEST_F(DataParallel, Llama) {
  check({"llama-tiny"}, kF32, kF32);
}
TEST_F(DataParallel, LlamaGradAccumulation) {
  check({"llama-tiny", DType::F32, 2}, kF32, kF32);
}
// Overlap off, and one bucket for everything: the same numbers.
TEST_F(DataParallel, Gpt2NoOverlapOneBucket) {
  check({"gpt-tiny", DType::F32, 2, false, 1000}, kF32, kF32);
}

// bf16 compute: the kernels read bf16 copies of the f32 master weights. The
// masters differ between the runs by f32 rounding (~1e-7), and a master that
// lies that close to a bf16 rounding midpoint rounds to the other neighbour,
// one bf16 ulp (2^-8 relative) away; from then on the forward passes differ at
// bf16 level and the difference grows with the steps. Tolerances: the loss
// within 1e-3 relative, the weights within one bf16 ulp (2^-8) in the
// per-tensor norm; measured over 10 steps on 4 ranks: 4e-5 and 5e-4.
TEST_F(DataParallel, Gpt2Bf16GradAccumulation) {
  check({"gpt-tiny", DType::BF16, 2}, 1e-3, 1.0 / 256);
}

// The distributed optimizer (ZeRO-1): the same figures as one process. The
// reduce-scatter sums in another order than the all-reduce, and the gradient
// norm adds the ranks' blocks: the same f32 tolerances hold. The weight
// gathers are waited for by the next forward (and validation) stage by stage.
TEST_F(DataParallel, Zero1Gpt2) {
  check({"gpt-tiny", DType::F32, 1, true, 0.02, "optimizer"}, kF32, kF32);
}
TEST_F(DataParallel, Zero1Gpt2GradAccumulation) {
  check({"gpt-tiny", DType::F32, 2, true, 0.02, "optimizer"}, kF32, kF32);
}
TEST_F(DataParallel, Zero1Llama) {
  check({"llama-tiny", DType::F32, 1, true, 0.02, "optimizer", 5}, kF32, kF32);
}
TEST_F(DataParallel, Zero1LlamaGradAccumulation) {
  check({"llama-tiny", DType::F32, 2, true, 0.02, "optimizer"}, kF32, kF32);
}
// One bucket: each rank's block cuts through parameters.
TEST_F(DataParallel, Zero1LlamaOneBucketNoOverlap) {
  check({"llama-tiny", DType::F32, 2, false, 1000, "optimizer"}, kF32, kF32);
}
// bf16 compute: the tolerances of plain DP in bf16, for the same reason.
TEST_F(DataParallel, Zero1Gpt2Bf16GradAccumulation) {
  check({"gpt-tiny", DType::BF16, 2, true, 0.02, "optimizer", 5}, 1e-3, 1.0 / 256);
}

// ZeRO-1 with the moments in bf16 or scaled f16 (optim.moment_dtype), one
// process rounding its moments alike: the gradients' summation order moves a
// moment across a bf16 (f16) rounding boundary now and then, a step of one
// ulp of the moment (2^-8 relative), which the weights feel as lr 2^-8 on
// that element: the bf16-compute tolerances cover it.
TEST_F(DataParallel, Zero1Gpt2Bf16Moments) {
  check({"gpt-tiny", DType::F32, 2, true, 0.02, "optimizer", 0, "", "bf16"}, 1e-3, 1.0 / 256);
}
TEST_F(DataParallel, Zero1LlamaF16Moments) {
  check({"llama-tiny", DType::BF16, 1, true, 0.02, "optimizer", 0, "", "f16"}, 1e-3, 1.0 / 256);
}

// A bf16 master with its compensating remainder (optim.master_dtype=bf16),
// plain data parallelism: every rank updates the whole master alike from the
// all-reduced gradients. The bf16-compute tolerances, for the same reason.
TEST_F(DataParallel, Gpt2Bf16MasterGradAccumulation) {
  Recipe r{"gpt-tiny", DType::BF16, 2};
  r.master = "bf16";
  check(r, 1e-3, 1.0 / 256);
}
TEST_F(DataParallel, LlamaBf16MasterBf16Moments) {
  Recipe r{"llama-tiny", DType::BF16, 1};
  r.master = "bf16";
  r.moments = "bf16";
  check(r, 1e-3, 1.0 / 256);
}

// ZeRO-1: each rank's optimizer keeps the remainders of its blocks and
// updates their bf16 part, which the weight gathers spread.
TEST_F(DataParallel, Zero1Gpt2Bf16MasterGradAccumulation) {
  Recipe r{"gpt-tiny", DType::BF16, 2, true, 0.02, "optimizer"};
  r.master = "bf16";
  check(r, 1e-3, 1.0 / 256);
}
TEST_F(DataParallel, Zero1LlamaBf16MasterBf16Moments) {
  Recipe r{"llama-tiny", DType::BF16, 1, true, 0.02, "optimizer"};
  r.master = "bf16";
  r.moments = "bf16";
  check(r, 1e-3, 1.0 / 256);
}

// FSDP: the same, each rank's compute blocks (the master's bf16 part)
// gathered stage by stage.
TEST_F(DataParallel, FsdpLlamaBf16MasterGradAccumulation) {
  Recipe r{"llama-tiny", DType::BF16, 2, true, 0.02, "full"};
  r.master = "bf16";
  check(r, 1e-3, 1.0 / 256);
}

// bf16 gradients (optim.grad_dtype=bf16): each rank accumulates its
// micro-batches into its bf16 arena and the buckets are summed (widened to
// f32 by MPI, rounded once); against one process with bf16 gradients: the
// loss within the bf16-compute tolerance, the weights within twice what bf16
// gradients move them from f32 ones (check: the two round at other points).
TEST_F(DataParallel, Gpt2Bf16GradsGradAccumulation) {
  Recipe r{"gpt-tiny", DType::BF16, 2};
  r.grads = "bf16";
  check(r, 1e-3, 1.0 / 256);
}
TEST_F(DataParallel, Zero1LlamaBf16GradsBf16Master) {
  Recipe r{"llama-tiny", DType::BF16, 2, true, 0.02, "optimizer"};
  r.grads = "bf16";
  r.master = "bf16";
  r.moments = "bf16";
  check(r, 1e-3, 1.0 / 256);
}
TEST_F(DataParallel, FsdpGpt2Bf16Grads) {
  Recipe r{"gpt-tiny", DType::BF16, 1, true, 0.02, "full"};
  r.grads = "bf16";
  check(r, 1e-3, 1.0 / 256);
}

// ZeRO-2: the gradients sharded too, every micro-batch's buckets
// reduce-scattered as they become final and the other blocks handed back
// (check: resident between steps and at most during them). The sums add
// each micro-batch's gradients to the reduced sum so far, in another order
// than one process: the same f32 tolerances hold.
TEST_F(DataParallel, Zero2Gpt2GradAccumulation) {
  check({"gpt-tiny", DType::F32, 2, true, 0.02, "grads"}, kF32, kF32);
}
TEST_F(DataParallel, Zero2Llama) {
  check({"llama-tiny", DType::F32, 1, true, 0.02, "grads", 5}, kF32, kF32);
}
TEST_F(DataParallel, Zero2LlamaGradAccumulation) {
  check({"llama-tiny", DType::F32, 4, true, 0.02, "grads"}, kF32, kF32);
}
// One bucket, no overlap: each rank's block cuts through parameters, and
// every micro-batch's reduction waits for its backward.
TEST_F(DataParallel, Zero2Gpt2OneBucketNoOverlap) {
  check({"gpt-tiny", DType::F32, 2, false, 1000, "grads"}, kF32, kF32);
}
// bf16 compute (the f32 master sharded as under ZeRO-1), bf16 gradients
// with a bf16 master: the tolerances of the same recipes under ZeRO-1.
TEST_F(DataParallel, Zero2Gpt2Bf16GradAccumulation) {
  check({"gpt-tiny", DType::BF16, 2, true, 0.02, "grads", 5}, 1e-3, 1.0 / 256);
}
TEST_F(DataParallel, Zero2LlamaBf16GradsBf16Master) {
  Recipe r{"llama-tiny", DType::BF16, 2, true, 0.02, "grads"};
  r.grads = "bf16";
  r.master = "bf16";
  r.moments = "bf16";
  check(r, 1e-3, 1.0 / 256);
}
TEST_F(DataParallel, Zero2WithFrozenEmbeddingAndFirstBlock) {
  check({"llama-tiny", DType::F32, 2, true, 0.02, "grads", 0, "wte,h.0.*"}, kF32, kF32);
}

// FSDP: the weights sharded too, each stage's gathered before it runs (GPT-2's
// tied head re-gathers the embeddings). The same tolerances as plain DP; the
// validation loss goes through the same gathers.
TEST_F(DataParallel, FsdpGpt2) {
  check({"gpt-tiny", DType::F32, 1, true, 0.02, "full", 5}, kF32, kF32);
}
TEST_F(DataParallel, FsdpGpt2GradAccumulation) {
  check({"gpt-tiny", DType::F32, 2, true, 0.02, "full"}, kF32, kF32);
}
TEST_F(DataParallel, FsdpLlama) {
  check({"llama-tiny", DType::F32, 1, true, 0.02, "full", 5}, kF32, kF32);
}
TEST_F(DataParallel, FsdpLlamaGradAccumulationNoOverlap) {
  check({"llama-tiny", DType::F32, 2, false, 0.02, "full"}, kF32, kF32);
}
// Frozen parameters have no bucket: they stay whole on every rank (ZeRO-1
// and FSDP alike) and unchanged, while the others train as in one process.
TEST_F(DataParallel, Zero1WithFrozenEmbeddingAndFirstBlock) {
  check({"llama-tiny", DType::F32, 2, true, 0.02, "optimizer", 0, "wte,h.0.*"}, kF32, kF32);
}
TEST_F(DataParallel, FsdpWithFrozenEmbeddingAndFirstBlock) {
  check({"llama-tiny", DType::F32, 2, true, 0.02, "full", 0, "wte,h.0.*"}, kF32, kF32);
}
TEST_F(DataParallel, FsdpGpt2Bf16GradAccumulation) {
  check({"gpt-tiny", DType::BF16, 2, true, 0.02, "full"}, 1e-3, 1.0 / 256);
}

// A data-parallel run stopped at step 5 (rank 0 writes the checkpoint: the
// weights are replicated) and resumed on the same number of ranks continues
// exactly as the uninterrupted one.
TEST_F(DataParallel, ResumeIsExact) {
  const Recipe r{"gpt-tiny", DType::F32, 2};
  dist::Mesh mesh = train_mesh(config(r, "unused", world_), world_, rank_);
  TrainParallel par{&mesh, groups_.get()};
  auto whole = whole_and_split(r, par);
  Trainer second(config(r, (base_ / "split").string(), world_), par);
  expect_continues(*whole, second, 0, "DP -> DP");
}

// ZeRO-1 stopped at step 5: every rank writes its optimizer shard into the
// checkpoint. Resumed on the same layout it continues bit for bit; resumed
// by one process, by FSDP and by plain data parallelism, it continues the
// same loss curve (within the f32 tolerance of the equivalence tests: the
// resumed runs add gradients in another order).
TEST_F(DataParallel, Zero1CheckpointReshards) {
  const Recipe zero{"llama-tiny", DType::F32, 1, true, 0.02, "optimizer"};
  const int64_t dp = world_;
  dist::Mesh mesh = train_mesh(config(zero, "unused", dp), world_, rank_);
  TrainParallel par{&mesh, groups_.get()};
  auto whole = whole_and_split(zero, par);
  const fs::path ckpt = split_checkpoint();
  if (rank_ == 0) {
    for (int64_t r = 0; r < dp; ++r)
      EXPECT_TRUE(fs::exists(ckpt / fmt::format("optimizer.{:05d}-of-{:05d}.safetensors", r, dp)));
    EXPECT_FALSE(fs::exists(ckpt / "optimizer.safetensors"));
  }
  const std::string from = "train.resume_from=" + ckpt.string();
  {
    Trainer second(config(zero, (base_ / "split").string(), dp), par);
    expect_continues(*whole, second, 0, "ZeRO-1 -> ZeRO-1");
  }
  {
    Trainer single(config(with_shard(zero, "none"), rank_dir("single"), dp, {from}));
    expect_continues(*whole, single, kF32, "ZeRO-1 -> one process");
  }
  {
    Trainer fsdp(config(with_shard(zero, "full"), (base_ / "fsdp").string(), dp, {from}), par);
    expect_continues(*whole, fsdp, kF32, "ZeRO-1 -> FSDP");
  }
  {
    Trainer zero2(config(with_shard(zero, "grads"), (base_ / "zero2").string(), dp, {from}), par);
    expect_continues(*whole, zero2, kF32, "ZeRO-1 -> ZeRO-2");
  }
  {
    Trainer ddp(config(with_shard(zero, "none"), (base_ / "plain").string(), dp, {from}), par);
    expect_continues(*whole, ddp, kF32, "ZeRO-1 -> plain DP");
  }
}

// Runs where the f32 master weights are sharded (ZeRO-1 in bf16, FSDP) save
// every rank's blocks of them as model.RRRRR-of-NNNNN pieces; the checkpoint
// continues bit for bit on the same layout and by one process within the
// equivalence tests' tolerance for the dtype.
TEST_F(DataParallel, Zero1Bf16CheckpointHoldsMasterPieces) {
  check_weight_pieces_resume({"llama-tiny", DType::BF16, 1, true, 0.02, "optimizer"}, 1e-3,
                             "ZeRO-1 bf16");
}
TEST_F(DataParallel, Zero1Bf16MasterCheckpointHoldsMasterPieces) {
  Recipe r{"gpt-tiny", DType::BF16, 1, true, 0.02, "optimizer"};
  r.master = "bf16";
  r.moments = "bf16";
  check_weight_pieces_resume(r, 1e-3, "ZeRO-1 bf16 master");
}
TEST_F(DataParallel, Zero2Bf16CheckpointHoldsMasterPieces) {
  check_weight_pieces_resume({"llama-tiny", DType::BF16, 2, true, 0.02, "grads"}, 1e-3,
                             "ZeRO-2 bf16");
}
TEST_F(DataParallel, FsdpBf16MasterCheckpointHoldsMasterPieces) {
  Recipe r{"gpt-tiny", DType::BF16, 2, true, 0.02, "full"};
  r.master = "bf16";
  check_weight_pieces_resume(r, 1e-3, "FSDP bf16 master");
}
TEST_F(DataParallel, FsdpCheckpointReshards) {
  check_weight_pieces_resume({"gpt-tiny", DType::F32, 2, true, 0.02, "full"}, kF32, "FSDP");
}

// One process saves; ZeRO-1 over every rank resumes it.
TEST_F(DataParallel, OneProcessCheckpointResumesUnderZero1) {
  Recipe one{"gpt-tiny", DType::F32, 1};
  const int64_t dp = world_;
  Trainer whole(config(one, rank_dir("whole"), dp));
  whole.run();
  const fs::path own = rank_dir("first");
  {
    Trainer first(config(one, own.string(), dp, {"train.exit_at_step=5"}));
    first.run();
  }
  const Recipe zero = with_shard(one, "optimizer");
  dist::Mesh mesh = train_mesh(config(zero, "unused", dp), world_, rank_);
  TrainParallel par{&mesh, groups_.get()};
  // Every rank names its own copy: they are the same bytes.
  Trainer resumed(config(zero, (base_ / "zero").string(), dp,
                         {"train.resume_from=" + (own / "checkpoints" / "step_00000005").string()}),
                  par);
  expect_continues(whole, resumed, kF32, "one process -> ZeRO-1");
}

}  // namespace
}  // namespace nk
