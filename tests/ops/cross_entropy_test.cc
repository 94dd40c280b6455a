// Softmax cross-entropy: reference gradient vs finite differences, the op on
// every backend vs the double reference (f32, bf16, V not a multiple of the
// chunk), ignored rows, in-place dlogits and out-of-range targets.
#include <gtest/gtest.h>

#include "op_harness.h"
#include "ops/ops.h"
#include "ops/ref/cross_entropy.h"

namespace nk {
namespace {

using test::values;
constexpr int64_t kIgnore = -100;

TEST(CrossEntropyRef, GradMatchesFiniteDifferences) {
  const int64_t N = 4, V = 7;
  const std::vector<int32_t> tg = {3, int32_t(kIgnore), 0, 6};
  const auto x = test::randn(N * V, 5, 2.0);
  const double g = 0.5;
  std::vector<double> losses(N), dx(N * V);
  ref::cross_entropy(losses.data(), dx.data(), x.data(), tg.data(), N, V, kIgnore, g);
  auto loss = [&](const std::vector<double>& xs) {
    std::vector<double> l(N);
    ref::cross_entropy<double>(l.data(), nullptr, xs.data(), tg.data(), N, V, kIgnore, 1.0);
    double s = 0;
    for (double v : l) s += g * v;
    return s;
  };
  test::check_grad_fd(loss, x, dx, "dlogits", 1e-6, 1e-6, 1000);
  for (int64_t j = 0; j < V; ++j) EXPECT_EQ(dx[V + j], 0.0);
  EXPECT_EQ(losses[1], 0.0);
}

struct Inputs {
  std::vector<double> x;
  std::vector<int32_t> tg;
  Tensor logits, targets;
};

Inputs inputs(Device dev, int64_t N, int64_t V, DType dt, uint64_t seed) {
  Inputs in;
  in.x = test::rounded(test::randn(N * V, seed, 3.0), dt);
  Rng r(seed + 1);
  for (int64_t i = 0; i < N; ++i) in.tg.push_back(int32_t(r.below(uint64_t(V))));
  if (N > 1) in.tg[1] = int32_t(kIgnore);
  in.logits = test::make({N, V}, dt, in.x, dev);
  in.targets = test::make_i32({N}, in.tg, dev);
  return in;
}

class CrossEntropyFast : public test::BackendTest {};
NK_INSTANTIATE_BACKENDS(CrossEntropyFast);

void check_fast(Device dev, int64_t N, int64_t V, DType dt) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " N=" << N << " V=" << V);
  Inputs in = inputs(dev, N, V, dt, 31 + V);
  const double g = 1.0 / N;
  std::vector<double> want_l(N), want_d(N * V);
  ref::cross_entropy(want_l.data(), want_d.data(), in.x.data(), in.tg.data(), N, V, kIgnore, g);
  // Loss is ~log V + O(1) and computed from exact-rounded inputs in fp32: the
  // bf16 path differs from f32 only in its dlogits output rounding.
  const test::Tol loss_tol = test::tol_for(DType::F32);
  Tensor losses = Tensor::empty({N}, DType::F32, dev);
  ops::cross_entropy_forward(losses, in.logits, in.targets, kIgnore);
  test::expect_close(values(losses), want_l, loss_tol, "losses (forward)");

  Tensor losses2 = Tensor::empty({N}, DType::F32, dev);
  Tensor dl = Tensor::empty({N, V}, dt, dev);
  ops::cross_entropy_forward_backward(losses2, dl, in.logits, in.targets, kIgnore, float(g));
  test::expect_close(values(losses2), want_l, loss_tol, "losses (forward_backward)");
  test::expect_close(values(dl), want_d, test::tol_for(dt), "dlogits");
  if (N > 1) {
    EXPECT_EQ(values(losses)[1], 0.0);
    EXPECT_EQ(values(losses2)[1], 0.0);
    for (int64_t j = 0; j < V; ++j) ASSERT_EQ(values(dl)[V + j], 0.0) << j;
  }

  // In place: dlogits aliases logits and gives the same bits.
  Tensor losses3 = Tensor::empty({N}, DType::F32, dev);
  ops::cross_entropy_forward_backward(losses3, in.logits, in.logits, in.targets, kIgnore, float(g));
  EXPECT_EQ(values(in.logits), values(dl));
  EXPECT_EQ(values(losses3), values(losses2));
}

NK_COVERS(CrossEntropyFast, MatchesReference, cross_entropy_forward,
          cross_entropy_forward_backward);
TEST_P(CrossEntropyFast, MatchesReference) {
  for (DType dt : {DType::F32, DType::BF16}) {
    check_fast(dev(), 1, 1, dt);
    check_fast(dev(), 3, 5, dt);
    check_fast(dev(), 5, 100, dt);
    check_fast(dev(), 7, 2048 + 37, dt);  // one full chunk and a ragged one
    check_fast(dev(), 4, 5000, dt);
  }
}

TEST_P(CrossEntropyFast, OutOfRangeTargetIsUserError) {
  Inputs in = inputs(dev(), 3, 10, DType::F32, 9);
  Tensor losses = Tensor::empty({3}, DType::F32, dev());
  for (int32_t bad : {10, -1, 1000}) {
    Tensor tg = test::make_i32({3}, {0, bad, 2}, dev());
    try {
      ops::cross_entropy_forward(losses, in.logits, tg, kIgnore);
      ADD_FAILURE() << "no error for target " << bad;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("row 1"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
    }
    Tensor dl = Tensor::empty({3, 10}, DType::F32, dev());
    EXPECT_THROW(ops::cross_entropy_forward_backward(losses, dl, in.logits, tg, kIgnore, 1.f),
                 Error);
  }
}

}  // namespace
}  // namespace nk
