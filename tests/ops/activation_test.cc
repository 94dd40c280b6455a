// GELU (tanh form), SiLU, ReLU and SwiGLU: reference backward vs finite differences, the
// ops on every backend vs the double reference (f32, bf16), aliasing and
// extreme inputs.
#include <cmath>

#include "ops/op_harness.h"
#include "ops/ops.h"
#include "ops/ref/activation.h"

namespace nk {
namespace {

using namespace test;  // the op harness: make, randn, expect_close, ...
using Vec = std::vector<double>;

TEST(ActivationRef, GeluBackwardMatchesFiniteDifferences) {
  const int64_t n = 50;
  Vec x = randn(n, 1, 2.0), dy = randn(n, 2), dx(n);
  ref::gelu_backward(dx.data(), dy.data(), x.data(), n);
  auto loss = [&](const Vec& v) {
    Vec y(n);
    ref::gelu_forward(y.data(), v.data(), n);
    return dot(y, dy);
  };
  check_grad_fd(loss, x, dx, "gelu dx");
}

TEST(ActivationRef, SiluAndReluGradientsMatchFiniteDifferences) {
  for (double x : {-7.5, -2.0, -0.3, 0.4, 1.5, 6.0}) {
    const double h = 1e-6;
    EXPECT_NEAR(ref::silu_grad(x), (ref::silu(x + h) - ref::silu(x - h)) / (2 * h), 1e-8) << x;
    EXPECT_NEAR(ref::relu_grad(x), (ref::relu(x + h) - ref::relu(x - h)) / (2 * h), 1e-8) << x;
  }
  EXPECT_EQ(ref::relu_grad(0.0), 0.0);  // as PyTorch's
  EXPECT_NEAR(ref::silu(1.0), 0.7310585786300049, 1e-15);
}

TEST(ActivationRef, GeluIsTheTanhForm) {
  // At x = 1: 0.5 (1 + tanh(sqrt(2/pi) 1.044715)) = 0.8411919906082768 (tanh form;
  // the erf form gives 0.8413447460685429).
  EXPECT_NEAR(ref::gelu(1.0), 0.8411919906082768, 1e-12);
}

TEST(ActivationRef, SwigluBackwardMatchesFiniteDifferences) {
  const int64_t N = 3, F = 7;
  Vec gu = randn(N * 2 * F, 3, 2.0), dy = randn(N * F, 4), dgu(N * 2 * F);
  ref::swiglu_backward(dgu.data(), dy.data(), gu.data(), N, F);
  auto loss = [&](const Vec& v) {
    Vec y(N * F);
    ref::swiglu_forward(y.data(), v.data(), N, F);
    return dot(y, dy);
  };
  check_grad_fd(loss, gu, dgu, "swiglu dgu");
}

// Random inputs plus the tails, where exp saturates.
Vec activation_inputs(int64_t n, uint64_t seed) {
  Vec x = randn(n, seed, 3.0);
  const double tails[] = {-100, -30, -9.5, 9.5, 30, 100, 0, -0.0};
  for (size_t i = 0; i < 8 && i < x.size(); ++i) x[i] = tails[i];
  return x;
}

class ActivationFast : public BackendTest {};
NK_INSTANTIATE_BACKENDS(ActivationFast);

NK_COVERS(ActivationFast, GeluMatchesReference, gelu_forward, gelu_backward);
TEST_P(ActivationFast, GeluMatchesReference) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t n : {1, 15, 1000, 70001}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " n=" << n);
      Vec x = rounded(activation_inputs(n, 5), dt), dy = rounded(randn(n, 6), dt);
      Tensor tx = make({n}, dt, x, dev()), ty = Tensor::empty({n}, dt, dev());
      ops::gelu_forward(ty, tx);
      Tensor tdy = make({n}, dt, dy, dev());
      ops::gelu_backward(tdy, tdy, tx);  // dx aliases dy
      Vec y(n), dx(n);
      ref::gelu_forward(y.data(), x.data(), n);
      ref::gelu_backward(dx.data(), dy.data(), x.data(), n);
      expect_close(values(ty), y, tol_for(dt), "y");
      expect_close(values(tdy), dx, tol_for(dt), "dx");
    }
  }
}

NK_COVERS(ActivationFast, SiluAndReluMatchReference, silu_forward, silu_backward, relu_forward,
          relu_backward);
TEST_P(ActivationFast, SiluAndReluMatchReference) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t n : {1, 15, 1000, 70001}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " n=" << n);
      Vec x = rounded(activation_inputs(n, 11), dt), dy = rounded(randn(n, 12), dt);
      for (bool silu : {true, false}) {
        Tensor tx = make({n}, dt, x, dev()), ty = Tensor::empty({n}, dt, dev());
        Tensor tdy = make({n}, dt, dy, dev());
        Vec y(n), dx(n);
        for (int64_t i = 0; i < n; ++i) {
          y[i] = silu ? ref::silu(x[i]) : ref::relu(x[i]);
          dx[i] = dy[i] * (silu ? ref::silu_grad(x[i]) : ref::relu_grad(x[i]));
        }
        if (silu) {
          ops::silu_forward(ty, tx);
          ops::silu_backward(tdy, tdy, tx);  // dx aliases dy
        } else {
          ops::relu_forward(ty, tx);
          ops::relu_backward(tdy, tdy, tx);
        }
        expect_close(values(ty), y, tol_for(dt), silu ? "silu y" : "relu y");
        expect_close(values(tdy), dx, tol_for(dt), silu ? "silu dx" : "relu dx");
        if (!silu) continue;
        ops::silu_forward(tx, tx);  // in place
        expect_close(values(tx), y, tol_for(dt), "silu in place");
      }
    }
  }
}

NK_COVERS(ActivationFast, SwigluMatchesReference, swiglu_forward, swiglu_backward);
TEST_P(ActivationFast, SwigluMatchesReference) {
  struct S {
    int64_t N, F;
  };
  for (DType dt : {DType::F32, DType::BF16}) {
    for (S s : {S{1, 5}, S{3, 17}, S{33, 688}}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " N=" << s.N << " F=" << s.F);
      Vec gu = rounded(activation_inputs(s.N * 2 * s.F, 7), dt);
      Vec dy = rounded(randn(s.N * s.F, 8), dt);
      Tensor tgu = make({s.N, 2 * s.F}, dt, gu, dev()), ty = Tensor::empty({s.N, s.F}, dt, dev());
      Tensor tdgu = make({s.N, 2 * s.F}, dt, randn(s.N * 2 * s.F, 9), dev());  // overwritten
      ops::swiglu_forward(ty, tgu);
      ops::swiglu_backward(tdgu, make({s.N, s.F}, dt, dy, dev()), tgu);
      Vec y(s.N * s.F), dgu(s.N * 2 * s.F);
      ref::swiglu_forward(y.data(), gu.data(), s.N, s.F);
      ref::swiglu_backward(dgu.data(), dy.data(), gu.data(), s.N, s.F);
      expect_close(values(ty), y, tol_for(dt), "y");
      expect_close(values(tdgu), dgu, tol_for(dt), "dgu");
    }
  }
}

TEST_P(ActivationFast, ExtremeInputsStayFinite) {
  Vec x = {-1e30, -1e4, -88, 88, 1e4, 1e30};
  const int64_t n = int64_t(x.size());
  Tensor tx = make({n}, DType::F32, x, dev()), ty = Tensor::empty({n}, DType::F32, dev());
  ops::gelu_forward(ty, tx);
  Vec y = values(ty);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_TRUE(std::isfinite(y[i])) << x[i];
    EXPECT_NEAR(y[i], x[i] > 0 ? x[i] : 0.0, 1e-6 * std::fabs(x[i])) << x[i];
  }
}

TEST_P(ActivationFast, RejectsOddSwigluWidth) {
  Tensor gu = Tensor::empty({2, 7}, DType::F32, dev()),
         y = Tensor::empty({2, 3}, DType::F32, dev());
  EXPECT_THROW(ops::swiglu_forward(y, gu), InternalError);
}

}  // namespace
}  // namespace nk
