// Vocabulary-parallel cross-entropy: the vocabulary split into 1, 2 and 3
// shards (uneven), each reduced to per-row statistics, combined as the
// all-reduces would (MAX of the maxima, then SUM of the rescaled sums and of
// the target logits), gives the losses and gradients of the double reference
// over the whole vocabulary, on every backend.
//
// Tolerance: 2e-6 relative to the largest loss / gradient. Each shard sums
// its exponentials in fp32 (at most 37 terms here), the combine adds 3 more
// roundings; the reference is double. A misplaced target (off by one shard
// offset) or a missing rescale moves losses by O(1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "op_harness.h"
#include "ops/ops.h"
#include "ops/ref/cross_entropy.h"

namespace nk {
namespace {

constexpr int64_t kIgnore = -100;

class CrossEntropyShard : public test::BackendTest {};
NK_INSTANTIATE_BACKENDS(CrossEntropyShard);

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

void check_split(Device dev, DType dt, const std::vector<int64_t>& bounds) {
  const int64_t N = 6, V = bounds.back();
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " shards=" << bounds.size() - 1);
  const std::vector<double> x = test::rounded(test::randn(N * V, 7, 4.0), dt);
  std::vector<int32_t> tg = {0, int32_t(kIgnore), int32_t(V - 1), 12, 13, 25};
  const double g = 0.25;
  std::vector<double> want_l(N), want_d(N * V);
  ref::cross_entropy(want_l.data(), want_d.data(), x.data(), tg.data(), N, V, kIgnore, g);

  const Tensor targets = test::make_i32({N}, tg, dev);
  const size_t S = bounds.size() - 1;
  std::vector<Tensor> logits(S), mx(S), se(S), tl(S);
  std::vector<double> gmax(N, -INFINITY);
  for (size_t s = 0; s < S; ++s) {
    const int64_t v0 = bounds[s], vs = bounds[s + 1] - v0;
    std::vector<double> part(size_t(N * vs));
    for (int64_t r = 0; r < N; ++r)
      for (int64_t j = 0; j < vs; ++j) part[size_t(r * vs + j)] = x[size_t(r * V + v0 + j)];
    logits[s] = test::make({N, vs}, dt, part, dev);
    mx[s] = test::make({N}, DType::F32, std::vector<double>(N, 0), dev);
    se[s] = test::make({N}, DType::F32, std::vector<double>(N, 0), dev);
    tl[s] = test::make({N}, DType::F32, std::vector<double>(N, 0), dev);
    ops::cross_entropy_shard_stats(mx[s], se[s], tl[s], logits[s], targets, v0);
    const std::vector<double> m = test::values(mx[s]);
    for (int64_t r = 0; r < N; ++r) gmax[size_t(r)] = std::max(gmax[size_t(r)], m[size_t(r)]);
  }
  // The all-reduces, done here over the shards in order.
  const Tensor global = test::make({N}, DType::F32, gmax, dev);
  std::vector<double> sum_se(N, 0), sum_tl(N, 0);
  for (size_t s = 0; s < S; ++s) {
    ops::cross_entropy_rescale_stats(mx[s], se[s], global);
    const std::vector<double> a = test::values(se[s]), b = test::values(tl[s]);
    for (int64_t r = 0; r < N; ++r) {
      sum_se[size_t(r)] += a[size_t(r)];
      sum_tl[size_t(r)] += b[size_t(r)];
    }
  }
  Tensor losses = test::make({N}, DType::F32, std::vector<double>(N, 0), dev);
  Tensor lse = test::make({N}, DType::F32, std::vector<double>(N, 0), dev);
  ops::cross_entropy_shard_finish(losses, lse, global, test::make({N}, DType::F32, sum_se, dev),
                                  test::make({N}, DType::F32, sum_tl, dev), targets, kIgnore);
  const std::vector<double> got_l = test::values(losses);
  const double lscale = max_abs(want_l);
  for (int64_t r = 0; r < N; ++r)
    EXPECT_LE(std::fabs(got_l[size_t(r)] - want_l[size_t(r)]), 2e-6 * lscale) << "row " << r;
  EXPECT_EQ(got_l[1], 0.0);  // ignored

  const double dscale = max_abs(want_d);
  for (size_t s = 0; s < S; ++s) {
    const int64_t v0 = bounds[s], vs = bounds[s + 1] - v0;
    Tensor d = test::make({N, vs}, dt, std::vector<double>(size_t(N * vs), 0), dev);
    ops::cross_entropy_shard_backward(d, logits[s], targets, lse, v0, kIgnore, float(g));
    const std::vector<double> got = test::values(d);
    const double tol = (dt == DType::BF16 ? 8e-3 : 2e-6) * dscale;  // bf16 stores dlogits
    for (int64_t r = 0; r < N; ++r)
      for (int64_t j = 0; j < vs; ++j)
        ASSERT_LE(std::fabs(got[size_t(r * vs + j)] - want_d[size_t(r * V + v0 + j)]), tol)
            << "shard " << s << " row " << r << " col " << j;
  }
}

NK_COVERS(CrossEntropyShard, ShardsCombineToTheWholeVocabulary, cross_entropy_shard_stats,
          cross_entropy_rescale_stats, cross_entropy_shard_finish, cross_entropy_shard_backward);
TEST_P(CrossEntropyShard, ShardsCombineToTheWholeVocabulary) {
  for (DType dt : {DType::F32, DType::BF16}) {
    check_split(dev(), dt, {0, 37});
    check_split(dev(), dt, {0, 19, 37});
    check_split(dev(), dt, {0, 12, 25, 37});
  }
}

// One shard: the same losses as the fused op the model's head uses.
TEST_P(CrossEntropyShard, OneShardEqualsTheFusedOp) {
  const int64_t N = 5, V = 300;
  const std::vector<double> x = test::randn(N * V, 3, 3.0);
  const std::vector<int32_t> tg = {1, 299, int32_t(kIgnore), 0, 150};
  Tensor logits = test::make({N, V}, DType::F32, x, dev());
  Tensor targets = test::make_i32({N}, tg, dev());
  auto zeros = [&] { return test::make({N}, DType::F32, std::vector<double>(N, 0), dev()); };
  Tensor fused = zeros(), mx = zeros(), se = zeros(), tl = zeros(), l = zeros(), z = zeros();
  ops::cross_entropy_forward(fused, logits, targets, kIgnore);
  ops::cross_entropy_shard_stats(mx, se, tl, logits, targets, 0);
  ops::cross_entropy_shard_finish(l, z, mx, se, tl, targets, kIgnore);
  const std::vector<double> a = test::values(fused), b = test::values(l);
  for (int64_t r = 0; r < N; ++r)
    EXPECT_NEAR(a[size_t(r)], b[size_t(r)], 2e-6 * std::fabs(a[size_t(r)]) + 1e-7);
}

TEST_P(CrossEntropyShard, ShapesAreChecked) {
  Tensor logits = test::make({2, 4}, DType::F32, std::vector<double>(8, 0), dev());
  Tensor targets = test::make_i32({3}, {0, 1, 2}, dev());
  Tensor r = test::make({2}, DType::F32, {0, 0}, dev());
  EXPECT_THROW(ops::cross_entropy_shard_stats(r, r, r, logits, targets, 0), std::exception);
  Tensor t2 = test::make_i32({2}, {0, 1}, dev());
  EXPECT_THROW(ops::cross_entropy_shard_stats(r, r, r, logits, t2, -1), std::exception);
}

}  // namespace
}  // namespace nk
