// The MoE block under expert parallelism (nn/expert_parallel.h) against its
// plain self: every rank routes its own tokens, the ep group (the whole
// world) splits the experts, and the outputs, the input and router
// gradients must equal the one-process block's on the same tokens; each
// rank's experts' weight gradients must equal the sum over ranks of the
// plain blocks' (the other experts' rows stay zero). Uneven counts come from
// the random router; a router of zeros sends every token to experts 0 and 1
// (ties go to the lower expert), so the other ranks receive no rows at all.
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "dist/mesh.h"
#include "nn/moe.h"
#include "parallel_env.h"

namespace nk {
namespace {

using test::mpi;

Tensor randn(Rng& r, Shape shape, double std) {
  Tensor t = Tensor::empty(shape, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(r.normal() * std);
  return t;
}

void expect_near(const Tensor& a, const Tensor& b, const char* what, int64_t first = 0,
                 int64_t n = -1) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  const int64_t end = n < 0 ? a.numel() : first + n;
  for (int64_t i = first; i < end; ++i) {
    const float x = a.data<float>()[i], y = b.data<float>()[i];
    ASSERT_NEAR(x, y, 1e-5 * (1 + std::fabs(y))) << what << " element " << i;
  }
}

// One MoE layer of E = 2 W experts, top 2, the same weights on every rank;
// `zero_router`: every token to experts 0 and 1.
void check(bool zero_router) {
  const int W = mpi().world_size(), rank = mpi().rank();
  dist::MeshSpec spec;
  spec.ep = W;
  const dist::Mesh mesh(W, rank, spec);
  dist::ProcessGroups groups = mpi().make_groups(mesh, 60);
  const int64_t N = 9, C = 6, E = 2 * W, k = 2, F = 5;
  Rng wr(11);
  nn::MoE plain;
  plain.router.w = zero_router ? Tensor::zeros({E, C}, DType::F32) : randn(wr, {E, C}, 0.8);
  plain.up = randn(wr, {E * 2 * F, C}, 0.5);
  plain.down = randn(wr, {E * C, F}, 0.5);
  plain.n_experts = E;
  plain.top_k = k;
  plain.d_ff = F;
  Rng xr(100 + uint64_t(rank));
  const Tensor x = randn(xr, {N, C}, 1.0), dy = randn(xr, {N, C}, 1.0);
  auto alloc = [](const Shape& shape, DType t) { return Tensor::zeros(shape, t); };

  // grads: router, up, down (zeroed), fed to `m`.
  auto run = [&](nn::MoE m, int64_t ep, Tensor& y, Tensor& dx, std::vector<Tensor>& grads) {
    grads = {Tensor::zeros({E, C}, DType::F32), Tensor::zeros(m.up.shape(), DType::F32),
             Tensor::zeros(m.down.shape(), DType::F32)};
    m.router.dw = grads[0];
    m.dup = grads[1];
    m.ddown = grads[2];
    auto s = nn::MoE::saved_for(N, C, E, k, F, DType::F32, alloc, ep);
    auto g = nn::MoE::scratch_for(N, C, E, k, F, DType::F32, alloc, ep);
    y = Tensor::empty({N, C}, DType::F32);
    dx = Tensor::empty({N, C}, DType::F32);
    m.forward(y, s, x);
    std::vector<float> balance(size_t(E), 0.1f);
    m.backward(dx, dy, s, g, x, balance, 0.2f);
    return s.exchange ? s.exchange->rows : int64_t(-1);
  };
  Tensor y0, dx0, y1, dx1;
  std::vector<Tensor> g0, g1;
  run(plain, 1, y0, dx0, g0);
  nn::MoE ep = plain;
  auto seconds = std::make_shared<double>(0.0);
  ep.ep = {&groups.get("ep"), seconds};
  const int64_t received = run(ep, W, y1, dx1, g1);
  if (zero_router) {
    EXPECT_EQ(received, rank == 0 ? int64_t(W) * N * k : 0);
  }

  expect_near(y1, y0, "y");
  expect_near(dx1, dx0, "dx");
  expect_near(g1[0], g0[0], "router gradient");
  // The plain blocks' expert gradients summed over the ranks: what this
  // rank's experts got from every rank's tokens.
  groups.get("world").all_reduce(g0[1]);
  groups.get("world").all_reduce(g0[2]);
  const int64_t El = E / W, e0 = rank * El;
  expect_near(g1[1], g0[1], "up gradient of this rank's experts", e0 * 2 * F * C, El * 2 * F * C);
  expect_near(g1[2], g0[2], "down gradient of this rank's experts", e0 * C * F, El * C * F);
  for (int64_t i = 0; i < g1[1].numel(); ++i)
    if (i < e0 * 2 * F * C || i >= (e0 + El) * 2 * F * C) {
      ASSERT_EQ(g1[1].data<float>()[i], 0.f) << "another rank's expert, element " << i;
    }
  EXPECT_GT(*seconds, 0.0);

  // The split layout (Transformer::set_expert_parallel): up and down hold
  // only this rank's experts' rows, indexed locally; the same outputs and,
  // for those rows, the same gradients.
  nn::MoE split = ep;
  split.up = plain.up.narrow0(e0 * 2 * F, El * 2 * F);
  split.down = plain.down.narrow0(e0 * C, El * C);
  Tensor y2, dx2;
  std::vector<Tensor> g2;
  run(split, W, y2, dx2, g2);
  expect_near(y2, y0, "y (split experts)");
  expect_near(dx2, dx0, "dx (split experts)");
  expect_near(g2[0], g0[0], "router gradient (split experts)");
  ASSERT_EQ(g2[1].numel(), El * 2 * F * C);
  ASSERT_EQ(g2[2].numel(), El * C * F);
  expect_near(g2[1], g0[1].narrow0(e0 * 2 * F, El * 2 * F), "up gradient (split experts)");
  expect_near(g2[2], g0[2].narrow0(e0 * C, El * C), "down gradient (split experts)");
  // Rows of another count of experts are refused, naming the counts.
  if (W == 1) return;
  nn::MoE wrong = ep;
  wrong.up = plain.up.narrow0(0, (E - 1) * 2 * F);
  wrong.down = plain.down.narrow0(0, (E - 1) * C);
  Tensor y3, dx3;
  std::vector<Tensor> g3;
  try {
    run(wrong, W, y3, dx3, g3);
    ADD_FAILURE() << "up of " << E - 1 << " experts was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("neither all"), std::string::npos) << e.what();
  }
}

TEST(ExpertParallel, DispatchCombineEqualsOneProcessWithUnevenCounts) {
  check(false);
}

TEST(ExpertParallel, RanksReceivingNoTokens) {
  check(true);
}

}  // namespace
}  // namespace nk
