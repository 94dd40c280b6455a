// The Mixture-of-Experts kernels (ops/moe.h) on every backend against host
// computations in double: routing scores, top-k and statistics; the router's
// backward against central finite differences of a double reference; and
// the token movement (gather, weighted combine, scatter) with dropped pairs;
// bad ids read from tensor memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>

#include "ops/moe.h"
#include "ops/op_harness.h"
#include "test_paths.h"
#include "test_util.h"

namespace nk {
namespace {

using test::expect_close;
using test::make;
using test::make_i32;
using test::randn;
using test::values;

class MoeRoute : public test::BackendTest {};
class MoeTokens : public test::BackendTest {};

struct RouteRef {
  std::vector<double> probs, weights, stats;
  std::vector<int> idx;
};

// ops/moe.h's routing, written again in double: spec's groups, bias (empty:
// none) and scaling; stats per segment of N / S rows.
RouteRef route_ref(const std::vector<double>& l, int64_t N, int64_t E, int64_t k,
                   const ops::MoeRouteSpec& spec, const std::vector<double>& bias = {},
                   int64_t S = 1) {
  RouteRef r;
  r.stats.assign(size_t(S * (E + 1)), 0.0);
  const int64_t G = spec.n_group, per = E / G;
  for (int64_t n = 0; n < N; ++n) {
    const double* x = &l[size_t(n * E)];
    double mx = *std::max_element(x, x + E), s = 0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(x[e] - mx);
    const double lse = mx + std::log(s);
    std::vector<double> p(static_cast<size_t>(E)), c(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      p[size_t(e)] = spec.sigmoid ? 1 / (1 + std::exp(-x[e])) : std::exp(x[e] - lse);
      c[size_t(e)] = p[size_t(e)] + (bias.empty() ? 0.0 : bias[size_t(e)]);
    }
    // Groups by the sum of their two best choice scores, the best kept.
    std::vector<double> gs(static_cast<size_t>(G));
    for (int64_t g = 0; g < G; ++g) {
      std::vector<double> v(c.begin() + g * per, c.begin() + (g + 1) * per);
      std::sort(v.rbegin(), v.rend());
      gs[size_t(g)] = v[0] + (per > 1 ? v[1] : 0.0);
    }
    std::vector<int> gorder(static_cast<size_t>(G));
    std::iota(gorder.begin(), gorder.end(), 0);
    std::stable_sort(gorder.begin(), gorder.end(),
                     [&](int a, int b) { return gs[size_t(a)] > gs[size_t(b)]; });
    std::vector<int> order;
    for (int64_t e = 0; e < E; ++e)
      if (std::find(gorder.begin(), gorder.begin() + spec.topk_group, int(e / per)) !=
          gorder.begin() + spec.topk_group)
        order.push_back(int(e));
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return c[size_t(a)] > c[size_t(b)]; });
    double z = 0;
    for (int64_t j = 0; j < k; ++j) z += p[size_t(order[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      r.idx.push_back(order[size_t(j)]);
      r.weights.push_back(p[size_t(order[size_t(j)])] / (spec.norm_topk ? z : 1.0) * spec.scaling);
    }
    const double row = spec.sigmoid ? std::accumulate(p.begin(), p.end(), 0.0) : 1.0;
    double* st = &r.stats[size_t((n / (N / S)) * (E + 1))];
    for (int64_t e = 0; e < E; ++e) st[e] += p[size_t(e)] / row;
    st[E] += lse * lse;
    r.probs.insert(r.probs.end(), p.begin(), p.end());
  }
  return r;
}

RouteRef route_ref(const std::vector<double>& l, int64_t N, int64_t E, int64_t k, bool sigmoid,
                   bool norm) {
  ops::MoeRouteSpec spec;
  spec.sigmoid = sigmoid;
  spec.norm_topk = norm;
  return route_ref(l, N, E, k, spec);
}

TEST_P(MoeRoute, ScoresTopkAndStatsMatchDouble) {
  const int64_t N = 9, E = 6, k = 2;
  for (DType dt : {DType::F32, DType::BF16})
    for (bool sigmoid : {false, true})
      for (bool norm : {false, true}) {
        SCOPED_TRACE(fmt::format("{} sigmoid={} norm={}", dtype_name(dt), sigmoid, norm));
        const std::vector<double> l = test::rounded(randn(size_t(N * E), 11, 1.5), dt);
        Tensor probs = Tensor::empty({N, E}, DType::F32, dev()),
               idx = Tensor::empty({N, k}, DType::I32, dev()),
               w = Tensor::empty({N, k}, DType::F32, dev()),
               stats = Tensor::empty({E + 1}, DType::F32, dev());
        ops::moe_route(probs, idx, w, stats, make({N, E}, dt, l, dev()), sigmoid, norm);
        const RouteRef r = route_ref(l, N, E, k, sigmoid, norm);
        expect_close(values(probs), r.probs, {1e-6, 1e-7}, "probs");
        expect_close(values(w), r.weights, {1e-6, 1e-7}, "weights");
        expect_close(values(stats), r.stats, {1e-6, 1e-6}, "stats");
        const std::vector<double> got = values(idx);
        for (size_t i = 0; i < r.idx.size(); ++i) EXPECT_EQ(int(got[i]), r.idx[i]) << i;
      }
}
NK_COVERS(MoeRoute, ScoresTopkAndStatsMatchDouble, moe_route);

TEST_P(MoeRoute, TiesGoToTheLowerExpert) {
  Tensor probs = Tensor::empty({1, 4}, DType::F32, dev()),
         idx = Tensor::empty({1, 2}, DType::I32, dev()),
         w = Tensor::empty({1, 2}, DType::F32, dev()),
         stats = Tensor::empty({5}, DType::F32, dev());
  ops::moe_route(probs, idx, w, stats, make({1, 4}, DType::F32, {0.5, 1.0, 0.5, 1.0}, dev()), false,
                 true);
  EXPECT_EQ(int(values(idx)[0]), 1);
  EXPECT_EQ(int(values(idx)[1]), 3);
  EXPECT_FLOAT_EQ(float(values(w)[0]), 0.5f);
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

TEST_P(MoeRoute, BackwardMatchesFiniteDifferences) {
  const int64_t N = 5, E = 5, k = 2;
  for (bool sigmoid : {false, true})
    for (bool norm : {false, true}) {
      SCOPED_TRACE(fmt::format("sigmoid={} norm={}", sigmoid, norm));
      // f32-exact logits, so that the kernel and the reference see the same values.
      const std::vector<double> l = test::rounded(randn(size_t(N * E), 21, 1.2), DType::F32);
      const std::vector<double> dw = test::rounded(randn(size_t(N * k), 22), DType::F32);
      const std::vector<double> g = test::rounded(randn(size_t(E), 23), DType::F32);
      const double zg = 0.375;
      Tensor logits = make({N, E}, DType::F32, l, dev());
      Tensor probs = Tensor::empty({N, E}, DType::F32, dev()),
             idx = Tensor::empty({N, k}, DType::I32, dev()),
             w = Tensor::empty({N, k}, DType::F32, dev()),
             stats = Tensor::empty({E + 1}, DType::F32, dev());
      ops::moe_route(probs, idx, w, stats, logits, sigmoid, norm);
      Tensor dl = Tensor::empty({N, E}, DType::F32, dev());
      ops::moe_route_backward(dl, make({N, k}, DType::F32, dw, dev()),
                              make({E}, DType::F32, g, dev()), float(zg), logits, probs, idx,
                              sigmoid, norm);
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

// DeepSeek-V3's routing (groups, the score-correction bias, the scaling,
// per-segment statistics) against an independent float64 PyTorch router
// (tests/ops/moe_route_reference.py) within 1e-5.
TEST_P(MoeRoute, DeepSeekRoutingMatchesTorchFloat64) {
  const int64_t N = 12, E = 16, k = 4;
  struct Case {
    bool sigmoid, norm;
    int64_t groups, keep, segments;
    double scaling;
    bool bias;
  };
  const std::vector<Case> cases = {{true, true, 4, 2, 3, 2.5, true},
                                   {true, false, 8, 3, 1, 1.0, true},
                                   {false, true, 4, 1, 2, 16.0, false},
                                   {false, false, 1, 1, 4, 1.0, true},
                                   {true, true, 16, 4, 1, 1.5, true}};
  test::TempDir dir("nk_moe_route_ref");
  nlohmann::json in = nlohmann::json::array();
  std::vector<std::vector<double>> got_probs, got_w, got_stats, got_idx;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::vector<double> l = test::rounded(randn(size_t(N * E), 31 + i, 1.5), DType::F32);
    std::vector<double> bias;
    if (c.bias) bias = test::rounded(randn(size_t(E), 41 + i, 0.05), DType::F32);
    ops::MoeRouteSpec spec;
    spec.sigmoid = c.sigmoid;
    spec.norm_topk = c.norm;
    spec.n_group = c.groups;
    spec.topk_group = c.keep;
    spec.scaling = c.scaling;
    Tensor probs = Tensor::empty({N, E}, DType::F32, dev()),
           idx = Tensor::empty({N, k}, DType::I32, dev()),
           w = Tensor::empty({N, k}, DType::F32, dev()),
           stats = Tensor::empty({c.segments, E + 1}, DType::F32, dev());
    ops::moe_route(probs, idx, w, stats, make({N, E}, DType::F32, l, dev()),
                   c.bias ? make({E}, DType::F32, bias, dev()) : Tensor(), spec);
    got_probs.push_back(values(probs));
    got_w.push_back(values(w));
    got_stats.push_back(values(stats));
    got_idx.push_back(values(idx));
    in.push_back({{"N", N},
                  {"E", E},
                  {"k", k},
                  {"n_group", c.groups},
                  {"topk_group", c.keep},
                  {"segments", c.segments},
                  {"sigmoid", c.sigmoid},
                  {"norm_topk", c.norm},
                  {"scaling", c.scaling},
                  {"bias", bias},
                  {"logits", l}});
  }
  test::write_file(dir / "in.json", in.dump());
  const test::RunResult py = test::run_command(std::string("/usr/bin/python3 ") + NK_SOURCE_DIR +
                                               "/tests/ops/moe_route_reference.py " +
                                               (dir / "in.json") + " " + (dir / "out.json"));
  ASSERT_EQ(py.code, 0) << py.out;
  const nlohmann::json out = nlohmann::json::parse(test::read_file(dir / "out.json"));
  ASSERT_EQ(out.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(fmt::format("case {}", i));
    expect_close(got_probs[i], out[i]["probs"].get<std::vector<double>>(), {1e-5, 1e-7}, "probs");
    expect_close(got_w[i], out[i]["weights"].get<std::vector<double>>(), {1e-5, 1e-7}, "weights");
    expect_close(got_stats[i], out[i]["stats"].get<std::vector<double>>(), {1e-5, 1e-6}, "stats");
    const std::vector<int> ref_idx = out[i]["idx"].get<std::vector<int>>();
    ASSERT_EQ(ref_idx.size(), got_idx[i].size());
    for (size_t j = 0; j < ref_idx.size(); ++j) EXPECT_EQ(int(got_idx[i][j]), ref_idx[j]) << j;
  }
}

// The bias chooses an expert its score alone would not; the weight is the
// unbiased score. The groups keep the chosen experts inside the best groups.
TEST_P(MoeRoute, BiasChoosesAndGroupsLimit) {
  ops::MoeRouteSpec spec;
  spec.sigmoid = true;
  spec.norm_topk = false;
  Tensor probs = Tensor::empty({1, 4}, DType::F32, dev()),
         idx = Tensor::empty({1, 2}, DType::I32, dev()),
         w = Tensor::empty({1, 2}, DType::F32, dev()),
         stats = Tensor::empty({5}, DType::F32, dev());
  const Tensor logits = make({1, 4}, DType::F32, {2.0, 1.0, 0.0, -1.0}, dev());
  ops::moe_route(probs, idx, w, stats, logits, make({4}, DType::F32, {0, 0, 0, 0.9}, dev()), spec);
  // 0.27 + 0.9 leads 0.88 and beats 0.73.
  EXPECT_EQ(int(values(idx)[0]), 3);
  EXPECT_EQ(int(values(idx)[1]), 0);
  EXPECT_NEAR(values(w)[0], 1 / (1 + std::exp(1.0)), 1e-7);
  // Two groups {0, 1} {2, 3}, one kept: the first (0.88 + 0.73 > 0.5 + 0.27).
  spec.n_group = 2;
  spec.topk_group = 1;
  ops::moe_route(probs, idx, w, stats, logits, Tensor(), spec);
  EXPECT_EQ(int(values(idx)[0]), 0);
  EXPECT_EQ(int(values(idx)[1]), 1);
  // Group scores use the biased scores: the bias moves the kept group.
  ops::moe_route(probs, idx, w, stats, logits, make({4}, DType::F32, {0, 0, 0.5, 0.5}, dev()),
                 spec);
  EXPECT_EQ(int(values(idx)[0]), 2);
  EXPECT_EQ(int(values(idx)[1]), 3);
  // k beyond the kept groups' experts, groups that do not divide E: errors.
  spec.topk_group = 1;
  Tensor idx3 = Tensor::empty({1, 3}, DType::I32, dev()),
         w3 = Tensor::empty({1, 3}, DType::F32, dev());
  EXPECT_ANY_THROW(ops::moe_route(probs, idx3, w3, stats, logits, Tensor(), spec));
  spec.n_group = 3;
  EXPECT_ANY_THROW(ops::moe_route(probs, idx, w, stats, logits, Tensor(), spec));
}

// The router's backward with groups, bias, scaling and per-segment
// balancing gradients (the sequence-wise loss's) against finite differences.
TEST_P(MoeRoute, DeepSeekBackwardMatchesFiniteDifferences) {
  const int64_t N = 6, E = 8, k = 3, S = 3;
  for (bool sigmoid : {false, true})
    for (bool norm : {false, true}) {
      SCOPED_TRACE(fmt::format("sigmoid={} norm={}", sigmoid, norm));
      ops::MoeRouteSpec spec;
      spec.sigmoid = sigmoid;
      spec.norm_topk = norm;
      spec.n_group = 4;
      spec.topk_group = 2;
      spec.scaling = 2.5;
      const std::vector<double> l = test::rounded(randn(size_t(N * E), 51, 1.2), DType::F32);
      const std::vector<double> bias = test::rounded(randn(size_t(E), 52, 0.1), DType::F32);
      const std::vector<double> dw = test::rounded(randn(size_t(N * k), 53), DType::F32);
      const std::vector<double> g = test::rounded(randn(size_t(S * E), 54), DType::F32);
      const double zg = 0.25;
      Tensor logits = make({N, E}, DType::F32, l, dev());
      Tensor probs = Tensor::empty({N, E}, DType::F32, dev()),
             idx = Tensor::empty({N, k}, DType::I32, dev()),
             w = Tensor::empty({N, k}, DType::F32, dev()),
             stats = Tensor::empty({S, E + 1}, DType::F32, dev());
      ops::moe_route(probs, idx, w, stats, logits, make({E}, DType::F32, bias, dev()), spec);
      Tensor dl = Tensor::empty({N, E}, DType::F32, dev());
      ops::moe_route_backward(dl, make({N, k}, DType::F32, dw, dev()),
                              make({S, E}, DType::F32, g, dev()), float(zg), logits, probs, idx,
                              spec);
      auto objective = [&](const std::vector<double>& x) {
        const RouteRef r = route_ref(x, N, E, k, spec, bias, S);
        double f = 0;
        for (size_t i = 0; i < dw.size(); ++i) f += dw[i] * r.weights[i];
        for (int64_t s = 0; s < S; ++s) {
          for (int64_t e = 0; e < E; ++e)
            f += g[size_t(s * E + e)] * r.stats[size_t(s * (E + 1) + e)];
          f += zg * r.stats[size_t(s * (E + 1) + E)];
        }
        return f;
      };
      std::vector<double> fd(l.size());
      const double h = 1e-6;
      for (size_t i = 0; i < l.size(); ++i) {
        std::vector<double> a = l, b = l;
        a[i] += h;
        b[i] -= h;
        fd[i] = (objective(a) - objective(b)) / (2 * h);
      }
      expect_close(values(dl), fd, {1e-5, 1e-6}, "dlogits");
    }
}

TEST_P(MoeTokens, GatherCombineScatterMatchHost) {
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
    Tensor xs = Tensor::empty({M, C}, dt, dev());
    ops::moe_gather(xs, make({N, C}, dt, x, dev()), make_i32({M}, src, dev()));
    std::vector<double> want;
    for (int32_t s : src) want.insert(want.end(), x.begin() + s * C, x.begin() + s * C + C);
    EXPECT_EQ(values(xs), want);

    Tensor y = Tensor::empty({N, C}, dt, dev()), sl = make_i32({N, k}, slot, dev()),
           wt = make({N, k}, DType::F32, w, dev());
    Tensor o = make({M, C}, dt, out, dev());
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
    Tensor dout = make({M, C}, dt, std::vector<double>(size_t(M * C), 7.0), dev());
    Tensor dwt = Tensor::empty({N, k}, DType::F32, dev());
    ops::moe_combine_backward(dout, dwt, make({N, C}, dt, dy, dev()), o, sl, wt);
    expect_close(values(dout), wdout, tol, "dout", {}, dt == DType::BF16);
    expect_close(values(dwt), wdw, {1e-6, 1e-6}, "dweights");
    Tensor dx = Tensor::empty({N, C}, dt, dev());
    ops::moe_scatter(dx, o, sl);  // the slots' rows summed back per token
    expect_close(values(dx), wdx, tol, "dx", {}, dt == DType::BF16);
  }
}
NK_COVERS(MoeTokens, GatherCombineScatterMatchHost, moe_gather, moe_combine, moe_combine_backward,
          moe_scatter);

// Ids read from tensor memory are checked by the kernels, on every backend:
// a source row, a slot or a chosen expert out of range is an nk::Error
// naming it.
TEST_P(MoeTokens, BadIdsAreErrors) {
  Tensor xs = Tensor::empty({2, 3}, DType::F32, dev()),
         x = make({2, 3}, DType::F32, randn(6, 1), dev());
  auto throws = [](const std::function<void()>& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "no error; expected " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  throws(
      [&] {
        ops::moe_gather(xs, x, make_i32({2}, {0, 2}, dev()));
      },
      "moe_gather: source row 2 of slot 1 is outside [0, 2)");
  const Tensor bad_slot = make_i32({1, 2}, {0, 2}, dev()),
               w = make({1, 2}, DType::F32, {1, 1}, dev());
  Tensor y = Tensor::empty({1, 3}, DType::F32, dev());
  throws([&] { ops::moe_combine(y, xs, bad_slot, w); },
         "moe_combine: slot 2 of row 0 is outside [-1, 2)");
  Tensor dout = Tensor::empty({2, 3}, DType::F32, dev()),
         dw = Tensor::empty({1, 2}, DType::F32, dev());
  throws([&] { ops::moe_combine_backward(dout, dw, y, xs, bad_slot, w); },
         "moe_combine_backward: slot 2 of row 0");
  throws(
      [&] {
        ops::moe_scatter(y, xs, make_i32({1, 2}, {-2, 0}, dev()));
      },
      "moe_scatter: slot -2 of row 0");
  // A router backward given an expert id past E.
  const Tensor logits = make({2, 3}, DType::F32, randn(6, 2), dev());
  Tensor probs = Tensor::empty({2, 3}, DType::F32, dev()),
         idx = Tensor::empty({2, 1}, DType::I32, dev()),
         weights = Tensor::empty({2, 1}, DType::F32, dev()),
         stats = Tensor::empty({4}, DType::F32, dev());
  ops::moe_route(probs, idx, weights, stats, logits, false, false);
  Tensor dl = Tensor::empty({2, 3}, DType::F32, dev());
  throws(
      [&] {
        ops::moe_route_backward(dl, make({2, 1}, DType::F32, {1, 1}, dev()),
                                make({3}, DType::F32, {0, 0, 0}, dev()), 0.f, logits, probs,
                                make_i32({2, 1}, {0, 3}, dev()), false, false);
      },
      "moe_route_backward: expert 3 of row 1");
}

NK_INSTANTIATE_BACKENDS(MoeRoute);
NK_INSTANTIATE_BACKENDS(MoeTokens);

}  // namespace
}  // namespace nk
