// The Mixture-of-Experts kernels (ops/moe.h, CPU only) against host
// computations in double: routing scores, top-k and statistics; the router's
// backward against central finite differences of a double reference; and
// the token movement (gather, weighted combine, scatter) with dropped pairs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/moe.h"
#include "ops/op_harness.h"

namespace nk {
namespace {

using test::expect_close;
using test::make;
using test::make_i32;
using test::randn;
using test::values;

struct RouteRef {
  std::vector<double> probs, weights, stats;
  std::vector<int> idx;
};

// ops/moe.h's routing, written again in double.
RouteRef route_ref(const std::vector<double>& l, int64_t N, int64_t E, int64_t k, bool sigmoid,
                   bool norm) {
  RouteRef r;
  r.stats.assign(size_t(E + 1), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const double* x = &l[size_t(n * E)];
    double mx = *std::max_element(x, x + E), s = 0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(x[e] - mx);
    const double lse = mx + std::log(s);
    std::vector<double> p(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      p[size_t(e)] = sigmoid ? 1 / (1 + std::exp(-x[e])) : std::exp(x[e] - lse);
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
    double z = 0;
    for (int64_t j = 0; j < k; ++j) z += p[size_t(order[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      r.idx.push_back(order[size_t(j)]);
      r.weights.push_back(p[size_t(order[size_t(j)])] / (norm ? z : 1.0));
    }
    const double row = sigmoid ? std::accumulate(p.begin(), p.end(), 0.0) : 1.0;
    for (int64_t e = 0; e < E; ++e) r.stats[size_t(e)] += p[size_t(e)] / row;
    r.stats[size_t(E)] += lse * lse;
    r.probs.insert(r.probs.end(), p.begin(), p.end());
  }
  return r;
}

TEST(MoeRoute, ScoresTopkAndStatsMatchDouble) {
  const int64_t N = 9, E = 6, k = 2;
  for (DType dt : {DType::F32, DType::BF16})
    for (bool sigmoid : {false, true})
      for (bool norm : {false, true}) {
        SCOPED_TRACE(fmt::format("{} sigmoid={} norm={}", dtype_name(dt), sigmoid, norm));
        const std::vector<double> l = test::rounded(randn(size_t(N * E), 11, 1.5), dt);
        Tensor probs = Tensor::empty({N, E}, DType::F32), idx = Tensor::empty({N, k}, DType::I32),
               w = Tensor::empty({N, k}, DType::F32), stats = Tensor::empty({E + 1}, DType::F32);
        ops::moe_route(probs, idx, w, stats, make({N, E}, dt, l), sigmoid, norm);
        const RouteRef r = route_ref(l, N, E, k, sigmoid, norm);
        expect_close(values(probs), r.probs, {1e-6, 1e-7}, "probs");
        expect_close(values(w), r.weights, {1e-6, 1e-7}, "weights");
        expect_close(values(stats), r.stats, {1e-6, 1e-6}, "stats");
        const std::vector<double> got = values(idx);
        for (size_t i = 0; i < r.idx.size(); ++i) EXPECT_EQ(int(got[i]), r.idx[i]) << i;
      }
}
NK_COVERS(MoeRoute, ScoresTopkAndStatsMatchDouble, moe_route);

TEST(MoeRoute, TiesGoToTheLowerExpert) {
  Tensor probs = Tensor::empty({1, 4}, DType::F32), idx = Tensor::empty({1, 2}, DType::I32),
         w = Tensor::empty({1, 2}, DType::F32), stats = Tensor::empty({5}, DType::F32);
  ops::moe_route(probs, idx, w, stats, make({1, 4}, DType::F32, {0.5, 1.0, 0.5, 1.0}), false, true);
  EXPECT_EQ(idx.data<int32_t>()[0], 1);
  EXPECT_EQ(idx.data<int32_t>()[1], 3);
  EXPECT_FLOAT_EQ(w.data<float>()[0], 0.5f);
}

// The scalar whose gradient moe_route_backward gives: sum dw . weights +
// sum_e g_e sum_n balancing score + zg sum_n lse^2, in double.
double route_objective(const std::vector<double>& l, int64_t N, int64_t E, int64_t k, bool sigmoid,
                       bool norm, const std::vector<double>& dw, const std::vector<double>& g,
                       double zg) {
  const RouteRef r = route_ref(l, N, E, k, sigmoid, norm);
  double f = zg * r.stats[size_t(E)];
  for (size_t i = 0; i < dw.size(); ++i) f += dw[i] * r.weights[i];
  for (int64_t e = 0; e < E; ++e) f += g[size_t(e)] * r.stats[size_t(e)];
  return f;
}

TEST(MoeRoute, BackwardMatchesFiniteDifferences) {
  const int64_t N = 5, E = 5, k = 2;
  for (bool sigmoid : {false, true})
    for (bool norm : {false, true}) {
      SCOPED_TRACE(fmt::format("sigmoid={} norm={}", sigmoid, norm));
      // f32-exact logits, so that the kernel and the reference see the same values.
      const std::vector<double> l = test::rounded(randn(size_t(N * E), 21, 1.2), DType::F32);
      const std::vector<double> dw = test::rounded(randn(size_t(N * k), 22), DType::F32);
      const std::vector<double> g = test::rounded(randn(size_t(E), 23), DType::F32);
      const double zg = 0.375;
      Tensor logits = make({N, E}, DType::F32, l);
      Tensor probs = Tensor::empty({N, E}, DType::F32), idx = Tensor::empty({N, k}, DType::I32),
             w = Tensor::empty({N, k}, DType::F32), stats = Tensor::empty({E + 1}, DType::F32);
      ops::moe_route(probs, idx, w, stats, logits, sigmoid, norm);
      Tensor dl = Tensor::empty({N, E}, DType::F32);
      ops::moe_route_backward(dl, make({N, k}, DType::F32, dw), make({E}, DType::F32, g), float(zg),
                              logits, probs, idx, sigmoid, norm);
      std::vector<double> fd(l.size());
      const double h = 1e-6;
      for (size_t i = 0; i < l.size(); ++i) {
        std::vector<double> a = l, b = l;
        a[i] += h;
        b[i] -= h;
        fd[i] = (route_objective(a, N, E, k, sigmoid, norm, dw, g, zg) -
                 route_objective(b, N, E, k, sigmoid, norm, dw, g, zg)) /
                (2 * h);
      }
      expect_close(values(dl), fd, {1e-5, 1e-6}, "dlogits");
    }
}
NK_COVERS(MoeRoute, BackwardMatchesFiniteDifferences, moe_route_backward);

TEST(MoeTokens, GatherCombineScatterMatchHost) {
  const int64_t N = 4, C = 3, k = 2, M = 7;
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const std::vector<double> x = test::rounded(randn(size_t(N * C), 31), dt);
    const std::vector<double> out = test::rounded(randn(size_t(M * C), 32), dt);
    const std::vector<double> dy = test::rounded(randn(size_t(N * C), 33), dt);
    const std::vector<double> w = test::rounded(randn(size_t(N * k), 34), DType::F32);
    // Row 2's second pair is dropped (-1); slot 6 is nobody's.
    const std::vector<int32_t> slot = {3, 0, 5, 1, 2, -1, 4, 6};
    const std::vector<int32_t> src = {0, 1, 2, 0, 3, 1, 3};
    Tensor xs = Tensor::empty({M, C}, dt);
    ops::moe_gather(xs, make({N, C}, dt, x), make_i32({M}, src));
    std::vector<double> want;
    for (int32_t s : src) want.insert(want.end(), x.begin() + s * C, x.begin() + s * C + C);
    EXPECT_EQ(values(xs), want);

    Tensor y = Tensor::empty({N, C}, dt), sl = make_i32({N, k}, slot),
           wt = make({N, k}, DType::F32, w);
    Tensor o = make({M, C}, dt, out);
    ops::moe_combine(y, o, sl, wt);
    std::vector<double> wy(size_t(N * C), 0.0), wdx(size_t(N * C), 0.0), wdw(size_t(N * k), 0.0),
        wdout(size_t(M * C), 7.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t s = slot[size_t(n * k + j)];
        if (s < 0) continue;
        for (int64_t c = 0; c < C; ++c) {
          wy[size_t(n * C + c)] += w[size_t(n * k + j)] * out[size_t(s * C + c)];
          wdw[size_t(n * k + j)] += dy[size_t(n * C + c)] * out[size_t(s * C + c)];
          wdout[size_t(s * C + c)] = w[size_t(n * k + j)] * dy[size_t(n * C + c)];
          wdx[size_t(n * C + c)] += out[size_t(s * C + c)];
        }
      }
    const test::Tol tol = test::tol_for(dt);
    expect_close(values(y), wy, tol, "y", {}, dt == DType::BF16);
    Tensor dout = make({M, C}, dt, std::vector<double>(size_t(M * C), 7.0));
    Tensor dwt = Tensor::empty({N, k}, DType::F32);
    ops::moe_combine_backward(dout, dwt, make({N, C}, dt, dy), o, sl, wt);
    expect_close(values(dout), wdout, tol, "dout", {}, dt == DType::BF16);
    expect_close(values(dwt), wdw, {1e-6, 1e-6}, "dweights");
    Tensor dx = Tensor::empty({N, C}, dt);
    ops::moe_scatter(dx, o, sl);  // the slots' rows summed back per token
    expect_close(values(dx), wdx, tol, "dx", {}, dt == DType::BF16);
  }
}
NK_COVERS(MoeTokens, GatherCombineScatterMatchHost, moe_gather, moe_combine, moe_combine_backward,
          moe_scatter);

TEST(MoeTokens, BadIdsAreErrors) {
  Tensor xs = Tensor::empty({2, 3}, DType::F32), x = make({2, 3}, DType::F32, randn(6, 1));
  EXPECT_THROW(ops::moe_gather(xs, x, make_i32({2}, {0, 2})), Error);
  Tensor y = Tensor::empty({1, 3}, DType::F32);
  EXPECT_THROW(ops::moe_combine(y, xs, make_i32({1, 2}, {0, 2}), make({1, 2}, DType::F32, {1, 1})),
               Error);
}

}  // namespace
}  // namespace nk
