// nn::MoE's hand-written backward against central finite differences of its
// forward (f32), for the input, the router and both expert projections, with
// the load-balancing and z-loss gradients fed in as the model feeds them:
// the objective is sum(y * cy) + sum_e g_e stats[e] + zg stats[E]. Entries
// whose perturbation changes some token's choice of experts (where the
// objective is not differentiable) are skipped, and counted.
#include "nn/moe.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"

namespace nk {
namespace {

struct Fixture {
  int64_t N = 7, C = 6, E = 4, k = 2, F = 5;
  Tensor x, router, up, down, cy;
  std::vector<float> g, xs;
  float zg = 0.3f;
  nn::MoE moe;
  nn::MoE::Saved s;
  nn::MoE::Scratch sc;

  explicit Fixture(bool sigmoid) {
    Rng r(5);
    auto randn = [&](Shape shape, double std) {
      Tensor t = Tensor::empty(shape, DType::F32);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(r.normal() * std);
      return t;
    };
    x = randn({N, C}, 1.0);
    router = randn({E, C}, 0.8);
    up = randn({E * 2 * F, C}, 0.5);
    down = randn({E * C, F}, 0.5);
    cy = randn({N, C}, 1.0);
    for (int64_t e = 0; e < E; ++e) g.push_back(float(r.normal() * 0.5));
    auto alloc = [](const Shape& shape, DType t) { return Tensor::zeros(shape, t); };
    s = nn::MoE::saved_for(N, C, E, k, F, DType::F32, alloc);
    sc = nn::MoE::scratch_for(N, C, E, k, F, DType::F32, alloc);
    moe.router.w = router;
    moe.up = up;
    moe.down = down;
    moe.n_experts = E;
    moe.top_k = k;
    moe.d_ff = F;
    moe.sigmoid = sigmoid;
    moe.norm_topk = !sigmoid;
  }
  // The objective in double, and the chosen experts.
  double objective(std::vector<int32_t>* idx = nullptr) {
    Tensor y = Tensor::empty({N, C}, DType::F32);
    moe.forward(y, s, x);
    double f = 0;
    for (int64_t i = 0; i < N * C; ++i) f += double(y.data<float>()[i]) * cy.data<float>()[i];
    const std::vector<float>& st = s.routing->stats;
    for (int64_t e = 0; e < E; ++e) f += double(g[size_t(e)]) * st[size_t(e)];
    f += double(zg) * st[size_t(E)];
    if (idx) *idx = s.routing->idx;
    return f;
  }
};

void check(bool sigmoid) {
  Fixture fx(sigmoid);
  Tensor dx = Tensor::empty({fx.N, fx.C}, DType::F32);
  Tensor dr = Tensor::zeros({fx.E, fx.C}, DType::F32);
  Tensor du = Tensor::zeros(fx.up.shape(), DType::F32),
         dd = Tensor::zeros(fx.down.shape(), DType::F32);
  fx.moe.router.dw = dr;
  fx.moe.dup = du;
  fx.moe.ddown = dd;
  std::vector<int32_t> idx0;
  fx.objective(&idx0);
  fx.moe.backward(dx, fx.cy, fx.s, fx.sc, fx.x, fx.g, fx.zg);
  int skipped = 0, checked = 0;
  for (auto [name, w, grad] : {std::tuple<const char*, Tensor, Tensor>{"x", fx.x, dx},
                               {"router", fx.router, dr},
                               {"up", fx.up, du},
                               {"down", fx.down, dd}}) {
    double scale = 0;
    for (int64_t i = 0; i < grad.numel(); ++i)
      scale = std::max(scale, std::fabs(double(grad.data<float>()[i])));
    for (int64_t i = 0; i < w.numel(); ++i) {
      float& v = w.data<float>()[i];
      const float keep = v, h = 1e-2f;
      std::vector<int32_t> ia, ib;
      v = keep + h;
      const double fa = fx.objective(&ia);
      v = keep - h;
      const double fb = fx.objective(&ib);
      v = keep;
      if (ia != idx0 || ib != idx0) {
        ++skipped;
        continue;
      }
      ++checked;
      const double fd = (fa - fb) / (2.0 * double(h));
      EXPECT_NEAR(grad.data<float>()[i], fd, 2e-3 * scale + 1e-4) << name << "[" << i << "]";
    }
  }
  EXPECT_GT(checked, 10 * skipped + 100) << "too few entries keep their routing";
  std::cout << "[ moe sigmoid=" << sigmoid << " ] " << checked << " entries checked, " << skipped
            << " skipped (routing changed)\n";
}

TEST(MoE, BackwardMatchesFiniteDifferencesSoftmaxTopkRenormalised) {
  check(false);
}
TEST(MoE, BackwardMatchesFiniteDifferencesSigmoid) {
  check(true);
}

}  // namespace
}  // namespace nk
