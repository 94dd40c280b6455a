// What the multi-process equivalence tests (data parallel, tensor and
// pipeline parallel) share: the fixture of every rank, each test's fresh
// folder and the corpus they train on, and the per-tensor comparison of two
// runs' weights.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <memory>

#include "dist/mesh.h"
#include "dist/process_groups.h"
#include "nn/param_layout.h"
#include "parallel_env.h"
#include "test_paths.h"

namespace nk::test {

struct RunDirs {
  std::filesystem::path base;    // BINARY_DIR/<suite>/<test>_np<world>, empty
  std::filesystem::path corpus;  // BINARY_DIR/<suite>/corpus.txt
};
// Rank 0 empties `base` and writes the corpus once; the caller then waits on
// a barrier before any rank uses them.
inline RunDirs prepare_run_dirs(const std::string& suite, int world, int rank) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(NK_BINARY_DIR) / suite;
  RunDirs d{root / (std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
                    "_np" + std::to_string(world)),
            root / "corpus.txt"};
  if (rank != 0) return d;
  fs::remove_all(d.base);
  fs::create_directories(d.base);
  if (!fs::exists(d.corpus)) {
    std::ofstream o(d.corpus.string() + ".tmp");
    for (int i = 0; i < 400; ++i)
      o << "The quick brown fox " << i << " jumps over the lazy dog. Water is wet.\n";
    o.close();
    fs::rename(d.corpus.string() + ".tmp", d.corpus);
  }
  return d;
}

// A test on every rank of the world: its rank, the one-dimensional mesh's
// groups ("world" for barriers), and the test's fresh folder and corpus.
class RankTest : public ::testing::Test {
 protected:
  // suite: the folder under BINARY_DIR.
  void set_up(const std::string& suite) {
    world_ = mpi().world_size();
    rank_ = mpi().rank();
    mesh_ = std::make_unique<dist::Mesh>(world_, rank_, dist::MeshSpec{});
    groups_ = std::make_unique<dist::ProcessGroups>(mpi().make_groups(*mesh_, 120));
    const RunDirs dirs = prepare_run_dirs(suite, world_, rank_);
    base_ = dirs.base;
    corpus_ = dirs.corpus;
    barrier();
  }
  void barrier() { groups_->get("world").barrier(); }
  // What every recipe of these suites shares: the corpus, and 10 steps of
  // micro-batches of B rows of 32 tokens at lr 3e-3.
  std::vector<std::string> common_options(int64_t B, int64_t global_batch) const {
    return {"data.path=" + corpus_.string(),
            "train.micro_batch=" + std::to_string(B),
            "train.global_batch=" + std::to_string(global_batch),
            "train.seq_len=32",
            "train.steps=10",
            "train.lr=3e-3",
            "train.warmup_steps=2",
            "train.log_every=100",
            "train.peak_tflops=1"};
  }

  int world_ = 1, rank_ = 0;
  std::unique_ptr<dist::Mesh> mesh_;
  std::unique_ptr<dist::ProcessGroups> groups_;
  std::filesystem::path base_, corpus_;
};

// The weights `a` and `b` (f32 arenas of `layout`): per tensor (or fused
// part), the relative difference in the 2-norm, ||a - b|| / ||a|| <= tol.
// Not per element: Adam divides each gradient element by its own running
// magnitude, so an element whose micro-batch contributions nearly cancel
// carries the relative rounding of that cancellation (order of additions)
// into its step, far above 1e-5 of its own size yet negligible in the
// tensor. The key bias is left out: its true gradient is zero (a constant
// added to every key shifts all of a query's scores alike, and softmax
// ignores that), so its computed gradient is rounding noise that Adam turns
// into steps of size lr in either run; it is only checked to stay within a
// few such steps.
// Calls fn(name, ||a - b||, ||a||, max |a - b|) for every tensor (or fused
// part) of `layout` in the arenas a and b, the key bias (see below) aside
// (and, in gradient arenas, the frozen parameters).
template <class Fn>
void for_each_weight_distance(const ParamLayout& layout, const Tensor& a, const Tensor& b, Fn&& fn,
                              const std::string& what = "") {
  for (const ParamInfo& p : layout.params()) {
    // Gradient arenas end at the trainable parameters: a frozen one (a MoE
    // router's score-correction bias) has no gradient to compare.
    if (!p.trainable && a.numel() < layout.total()) continue;
    std::vector<std::string> parts;
    for (const ParamPart& part : p.parts) parts.push_back(part.name);
    if (parts.empty()) parts.push_back("");
    for (const std::string& part : parts) {
      Tensor x = part.empty() ? ParamLayout::view(a, p) : ParamLayout::part_view(a, p, part);
      Tensor y = part.empty() ? ParamLayout::view(b, p) : ParamLayout::part_view(b, p, part);
      double norm = 0, diff = 0, dmax = 0;
      for (int64_t k = 0; k < x.numel(); ++k) {
        const double u = x.data<float>()[k], d = u - y.data<float>()[k];
        norm += u * u;
        diff += d * d;
        dmax = std::max(dmax, std::abs(d));
      }
      const std::string name = what + p.name + (part.empty() ? "" : " part " + part);
      if (part == "k" && p.name.ends_with("attn.qkv.bias"))
        EXPECT_LE(dmax, 10 * 3e-3) << name;
      else
        fn(name, std::sqrt(diff), std::sqrt(norm), dmax);
    }
  }
}

inline void expect_weights_close(const ParamLayout& layout, const Tensor& a, const Tensor& b,
                                 double tol, const std::string& what = "") {
  for_each_weight_distance(
      layout, a, b,
      [&](const std::string& name, double diff, double norm, double dmax) {
        EXPECT_LE(diff, tol * norm)
            << name << ": |diff| " << diff << " of |w| " << norm << ", max elementwise " << dmax;
      },
      what);
}

// The largest ||a - b|| / ||a|| over the tensors (and fused parts).
inline double max_weight_distance(const ParamLayout& layout, const Tensor& a, const Tensor& b) {
  double worst = 0;
  for_each_weight_distance(layout, a, b, [&](const std::string&, double diff, double norm, double) {
    worst = std::max(worst, diff / std::max(norm, 1e-30));
  });
  return worst;
}

}  // namespace nk::test
