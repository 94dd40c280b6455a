// nn::MoE's hand-written backward against central finite differences of its
// forward (f32), for the input, the router and both expert projections, with
// the load-balancing and z-loss gradients fed in as the model feeds them:
// the objective is sum(y * cy) + sum_e g_e stats[e] + zg stats[E]. Entries
// whose perturbation changes some token's choice of experts (where the
// objective is not differentiable) are skipped, and counted. With a capacity
// factor, the pairs past each expert's capacity (in token order) are
// dropped: checked against the rule, and the gradient again. DeepSeek-V3's
// routing (groups, the choice-only bias, the scaling) too. With a shared
// expert (ungated, and behind Qwen2-MoE's sigmoid gate) its projections' and
// gate's gradients are checked too. And the layer on CUDA against the CPU
// (where a GPU runs it).
#include "nn/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "core/allocator.h"
#include "core/rng.h"
#include "ops/op_harness.h"

namespace nk {
namespace {

struct Fixture {
  int64_t N = 7, C = 6, E = 4, k = 2, F = 5;
  int64_t Fs = 3;
  Tensor x, router, up, down, cy, sh_up, sh_down, sh_gate;
  std::vector<float> g, xs;
  float zg = 0.3f;
  nn::MoE moe;
  nn::MoE::Saved s;
  nn::MoE::Scratch sc;

  // deepseek: DeepSeek-V3's routing, two groups of which one is kept, a
  // score bias and a scaling of the weights. shared: 0 none, 1 a shared
  // expert, 2 a gated shared expert.
  // dev: where the tensors live (the same values on every device).
  explicit Fixture(bool sigmoid, double cf = 0, bool deepseek = false, int shared = 0,
                   Device dev = kHost) {
    Rng r(5);
    auto randn = [&](Shape shape, double std) {
      Tensor t = Tensor::empty(shape, DType::F32);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(r.normal() * std);
      return test::to_device(t, dev);
    };
    x = randn({N, C}, 1.0);
    router = randn({E, C}, 0.8);
    up = randn({E * 2 * F, C}, 0.5);
    down = randn({E * C, F}, 0.5);
    cy = randn({N, C}, 1.0);
    for (int64_t e = 0; e < E; ++e) g.push_back(float(r.normal() * 0.5));
    auto alloc = [dev](const Shape& shape, DType t) { return Tensor::zeros(shape, t, dev); };
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
    moe.capacity_factor = cf;
    if (deepseek) {
      moe.n_group = 2;
      moe.topk_group = 1;
      moe.scaling = 2.5;
      moe.norm_topk = true;
      moe.bias = randn({E}, 0.1);
    }
    if (shared == 0) return;
    sh_up = randn({2 * Fs, C}, 0.5);
    sh_down = randn({C, Fs}, 0.5);
    moe.shared_d_ff = Fs;
    moe.shared_up.w = sh_up;
    moe.shared_down.w = sh_down;
    if (shared == 2) {
      sh_gate = randn({1, C}, 0.8);
      moe.shared_gate.w = sh_gate;
    }
    nn::MoE::add_shared(&s, &sc, N, C, Fs, shared == 2, DType::F32, alloc);
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

void check(bool sigmoid, double cf = 0, bool deepseek = false, int shared = 0) {
  Fixture fx(sigmoid, cf, deepseek, shared);
  Tensor dx = Tensor::empty({fx.N, fx.C}, DType::F32);
  Tensor dr = Tensor::zeros({fx.E, fx.C}, DType::F32);
  Tensor du = Tensor::zeros(fx.up.shape(), DType::F32),
         dd = Tensor::zeros(fx.down.shape(), DType::F32);
  fx.moe.router.dw = dr;
  fx.moe.dup = du;
  fx.moe.ddown = dd;
  std::vector<std::tuple<const char*, Tensor, Tensor>> params = {
      {"x", fx.x, dx}, {"router", fx.router, dr}, {"up", fx.up, du}, {"down", fx.down, dd}};
  for (auto [name, w, lin] :
       {std::tuple<const char*, Tensor, nn::Linear*>{"shared_up", fx.sh_up, &fx.moe.shared_up},
        {"shared_down", fx.sh_down, &fx.moe.shared_down},
        {"shared_gate", fx.sh_gate, &fx.moe.shared_gate}}) {
    if (!w.defined()) continue;
    lin->dw = Tensor::zeros(w.shape(), DType::F32);
    params.push_back({name, w, lin->dw});
  }
  std::vector<int32_t> idx0;
  fx.objective(&idx0);
  if (cf > 0) {
    EXPECT_LT(fx.s.routing->slots, fx.N * fx.k) << "nothing dropped";
  }
  fx.moe.backward(dx, fx.cy, fx.s, fx.sc, fx.x, fx.g, fx.zg);
  int skipped = 0, checked = 0;
  for (auto [name, w, grad] : params) {
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
  std::cout << "[ moe sigmoid=" << sigmoid << " shared=" << shared << " ] " << checked
            << " entries checked, " << skipped << " skipped (routing changed)\n";
}

TEST(MoE, BackwardMatchesFiniteDifferencesSoftmaxTopkRenormalised) {
  check(false);
}
TEST(MoE, BackwardMatchesFiniteDifferencesDeepSeekRouting) {
  check(true, 0, true);
}
TEST(MoE, BackwardMatchesFiniteDifferencesSigmoid) {
  check(true);
}
TEST(MoE, BackwardMatchesFiniteDifferencesWithTokenDropping) {
  check(false, 0.75);
}
TEST(MoE, BackwardMatchesFiniteDifferencesWithASharedExpert) {
  check(false, 0, false, 1);
}
TEST(MoE, BackwardMatchesFiniteDifferencesWithAGatedSharedExpert) {
  check(false, 0, false, 2);
  check(true, 0, false, 2);
}

TEST(MoE, CapacityDropsThePairsPastEachExpertsCapacityInTokenOrder) {
  Fixture dropless(false), big(false, 100.0), fx(false, 0.5);
  Tensor y0 = Tensor::empty({fx.N, fx.C}, DType::F32), y1 = Tensor::empty({fx.N, fx.C}, DType::F32);
  dropless.moe.forward(y0, dropless.s, dropless.x);
  big.moe.forward(y1, big.s, big.x);  // a capacity no expert reaches: dropless, bit for bit
  EXPECT_EQ(0, std::memcmp(y0.raw(), y1.raw(), y0.nbytes()));
  Tensor y = Tensor::empty({fx.N, fx.C}, DType::F32);
  fx.moe.forward(y, fx.s, fx.x);
  const nn::MoeRouting& r = *fx.s.routing;
  const int64_t cap = int64_t(std::ceil(0.5 * double(fx.N * fx.k) / double(fx.E)));
  std::vector<int64_t> seen(size_t(fx.E), 0);
  int64_t kept = 0;
  for (int64_t i = 0; i < fx.N * fx.k; ++i) {
    const int64_t e = r.idx[size_t(i)];
    const bool keep = seen[size_t(e)]++ < cap;
    EXPECT_EQ(r.slot[size_t(i)] >= 0, keep) << "pair " << i;
    kept += keep;
  }
  EXPECT_EQ(r.slots, kept);
  EXPECT_LT(kept, fx.N * fx.k);
  // Each token's output is its kept pairs' share of the dropless one's: a
  // token with every pair dropped outputs 0, one with none dropped the same
  // (to rounding: its experts' products now have fewer rows, and the GEMM
  // may block a product of other rows differently: bit-equal under the
  // AVX-512 kernels, 1 ulp apart under oneDNN capped at AVX2).
  for (int64_t n = 0; n < fx.N; ++n) {
    int64_t n_kept = 0;
    for (int64_t j = 0; j < fx.k; ++j) n_kept += r.slot[size_t(n * fx.k + j)] >= 0;
    for (int64_t c = 0; c < fx.C; ++c) {
      const float got = y.data<float>()[n * fx.C + c], full = y0.data<float>()[n * fx.C + c];
      if (n_kept == 0) {
        EXPECT_EQ(got, 0.f) << n;
      }
      if (n_kept == fx.k) {
        EXPECT_NEAR(got, full, 1e-6f * std::max(1.f, std::fabs(full))) << n;
      }
    }
  }
}

// The layer on CUDA against the same layer on the CPU: forward (y, the
// chosen experts, the routing statistics) and backward (dx, the router's,
// the experts' and the shared expert's gradients), under each routing the
// finite-difference checks above cover: softmax top-k renormalised, sigmoid,
// DeepSeek-V3's groups, bias and scaling, token dropping, and a gated shared
// expert. Skipped where no GPU runs it.
TEST(MoE, CudaMatchesTheCpu) {
  if (!device_available(Device::CUDA))
    GTEST_SKIP() << "cuda not run: " << why_unavailable(Device::CUDA);
  struct Case {
    bool sigmoid;
    double cf;
    bool deepseek;
    int shared;
  };
  for (const Case& c : {Case{false, 0, false, 0}, Case{true, 0, false, 0}, Case{true, 0, true, 0},
                        Case{false, 0.75, false, 0}, Case{false, 0, false, 2}}) {
    SCOPED_TRACE(::testing::Message() << "sigmoid=" << c.sigmoid << " cf=" << c.cf
                                      << " deepseek=" << c.deepseek << " shared=" << c.shared);
    std::vector<std::vector<double>> got[2];
    std::vector<int32_t> idx[2];
    for (int d = 0; d < 2; ++d) {
      const Device dev = d == 0 ? kHost : Device::CUDA;
      Fixture fx(c.sigmoid, c.cf, c.deepseek, c.shared, dev);
      auto grad = [&](nn::Linear& l) {
        if (l.w.defined()) l.dw = Tensor::zeros(l.w.shape(), DType::F32, dev);
      };
      grad(fx.moe.router);
      grad(fx.moe.shared_up);
      grad(fx.moe.shared_down);
      grad(fx.moe.shared_gate);
      fx.moe.dup = Tensor::zeros(fx.up.shape(), DType::F32, dev);
      fx.moe.ddown = Tensor::zeros(fx.down.shape(), DType::F32, dev);
      Tensor y = Tensor::empty({fx.N, fx.C}, DType::F32, dev),
             dx = Tensor::empty({fx.N, fx.C}, DType::F32, dev);
      fx.moe.forward(y, fx.s, fx.x);
      idx[d] = fx.s.routing->idx;
      got[d].push_back(test::values(y));
      got[d].emplace_back(fx.s.routing->stats.begin(), fx.s.routing->stats.end());
      fx.moe.backward(dx, fx.cy, fx.s, fx.sc, fx.x, fx.g, fx.zg);
      got[d].push_back(test::values(dx));
      for (const Tensor& t : {fx.moe.router.dw, fx.moe.dup, fx.moe.ddown, fx.moe.shared_up.dw,
                              fx.moe.shared_down.dw, fx.moe.shared_gate.dw})
        if (t.defined()) got[d].push_back(test::values(t));
    }
    EXPECT_EQ(idx[0], idx[1]) << "the CUDA router chose other experts";
    const char* names[] = {"y",
                           "stats",
                           "dx",
                           "router.dw",
                           "dup",
                           "ddown",
                           "shared_up.dw",
                           "shared_down.dw",
                           "shared_gate.dw"};
    ASSERT_EQ(got[0].size(), got[1].size());
    for (size_t i = 0; i < got[0].size(); ++i) {
      ASSERT_EQ(got[0][i].size(), got[1][i].size()) << names[i];
      double scale = 0;
      for (double v : got[0][i]) scale = std::max(scale, std::fabs(v));
      for (size_t j = 0; j < got[0][i].size(); ++j)
        EXPECT_NEAR(got[1][i][j], got[0][i][j], 1e-5 * std::max(1.0, scale))
            << names[i] << "[" << j << "]";
    }
  }
}

}  // namespace
}  // namespace nk
