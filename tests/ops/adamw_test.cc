// AdamW: reference step and the op on every backend vs a hand-written scalar
// step in double (PyTorch semantics), param_copy, odd sizes, and thread-count
// determinism.
#include <cmath>

#include "core/parallel.h"
#include "ops/op_harness.h"
#include "ops/ops.h"
#include "ops/ref/adamw.h"

namespace nk {
namespace {

using namespace test;  // the op harness: make, randn, expect_close, ...
using Vec = std::vector<double>;

struct State {
  Vec p, m, v;
};

// One PyTorch AdamW step, written out independently of ref::adamw_step.
void hand_step(State& s, const Vec& grad, const ops::AdamWParams& h) {
  for (size_t i = 0; i < s.p.size(); ++i) {
    double g = grad[i] * double(h.grad_scale);
    s.p[i] -= double(h.lr) * double(h.weight_decay) * s.p[i];
    s.m[i] = double(h.beta1) * s.m[i] + (1 - double(h.beta1)) * g;
    s.v[i] = double(h.beta2) * s.v[i] + (1 - double(h.beta2)) * g * g;
    double mhat = s.m[i] / (1 - std::pow(double(h.beta1), double(h.step)));
    double vhat = s.v[i] / (1 - std::pow(double(h.beta2), double(h.step)));
    s.p[i] -= double(h.lr) * mhat / (std::sqrt(vhat) + double(h.eps));
  }
}

ops::AdamWParams params(int64_t step) {
  ops::AdamWParams h{};
  h.lr = 1e-2f;
  h.beta1 = 0.9f;
  h.beta2 = 0.95f;
  h.eps = 1e-8f;
  h.weight_decay = 0.1f;
  h.step = step;
  h.grad_scale = 0.5f;
  return h;
}

TEST(AdamWRef, MatchesHandWrittenStep) {
  const int64_t n = 40;
  State s{randn(n, 1), Vec(n, 0.0), Vec(n, 0.0)};
  State r = s;
  for (int64_t step = 1; step <= 3; ++step) {
    Vec g = randn(n, 10 + step);
    auto h = params(step);
    hand_step(s, g, h);
    ref::adamw_step<double>(r.p.data(), g.data(), r.m.data(), r.v.data(), n, h.lr, h.beta1, h.beta2,
                            h.eps, h.weight_decay, step, h.grad_scale);
  }
  expect_close(r.p, s.p, {1e-12, 1e-12}, "p");
  expect_close(r.m, s.m, {1e-12, 1e-12}, "m");
  expect_close(r.v, s.v, {1e-12, 1e-12}, "v");
}

class AdamWFast : public BackendTest {};
NK_INSTANTIATE_BACKENDS(AdamWFast);

void fast_vs_hand(Device dev, int64_t n, DType copy_dt) {
  SCOPED_TRACE(testing::Message() << "n=" << n << " copy=" << dtype_name(copy_dt));
  State s{rounded(randn(n, 2), DType::F32), rounded(randn(n, 3, 0.01), DType::F32),
          rounded(Vec(n, 1e-4), DType::F32)};  // nonzero moments: a mid-training state
  Tensor p = make({n}, DType::F32, s.p, dev), m = make({n}, DType::F32, s.m, dev),
         v = make({n}, DType::F32, s.v, dev), copy = make({n}, copy_dt, Vec(n), dev);
  for (int64_t step = 1; step <= 3; ++step) {
    Vec g = rounded(randn(n, 20 + step), DType::F32);
    auto h = params(step);
    ops::adamw_step(p, make({n}, DType::F32, g, dev), m, v, h, copy);
    hand_step(s, g, h);
  }
  // fp32 state over three steps: a few ulp of each update.
  expect_close(values(p), s.p, {1e-5, 1e-6}, "p");
  expect_close(values(m), s.m, {1e-5, 1e-7}, "m");
  expect_close(values(v), s.v, {1e-5, 1e-9}, "v");
  // The copy holds exactly the new params rounded to its dtype.
  expect_close(values(copy), rounded(values(p), copy_dt), {0, 0}, "param_copy");
}

TEST_P(AdamWFast, MatchesHandWrittenStep) {
  for (int64_t n : {1, 15, 16, 17, 1000, 100003}) {
    fast_vs_hand(dev(), n, DType::BF16);
    fast_vs_hand(dev(), n, DType::F32);
  }
}

TEST_P(AdamWFast, WithoutCopyAndBitIdenticalAcrossThreadCounts) {
  const int64_t n = 70001;
  Vec p0 = randn(n, 5), g = randn(n, 6);
  std::vector<Vec> results;
  const int saved = num_threads();
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tensor p = make({n}, DType::F32, p0, dev()), m = make({n}, DType::F32, Vec(n), dev()),
           v = make({n}, DType::F32, Vec(n), dev());
    ops::adamw_step(p, make({n}, DType::F32, g, dev()), m, v, params(1));
    results.push_back(values(p));
  }
  set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

TEST_P(AdamWFast, RejectsMismatchedSizes) {
  Tensor p = Tensor::empty({8}, DType::F32, dev()), g = Tensor::empty({7}, DType::F32, dev());
  Tensor m = Tensor::empty({8}, DType::F32, dev()), v = Tensor::empty({8}, DType::F32, dev());
  EXPECT_THROW(ops::adamw_step(p, g, m, v, params(1)), InternalError);
}

}  // namespace
}  // namespace nk
