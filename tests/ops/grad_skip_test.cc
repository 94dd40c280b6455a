// Frozen parameters: every backward that accumulates a parameter gradient
// (linear, LayerNorm, RMSNorm, embedding) skips an undefined one, and each of
// its other outputs is bit for bit what it is when every gradient is computed.
#include <cstring>

#include "ops/op_harness.h"
#include "ops/ops.h"

namespace nk {
namespace {

using namespace test;  // the op harness: make, randn, ...

// A copy of t (same dtype and bytes), or undefined when `keep` is false.
Tensor copy_if(const Tensor& t, bool keep) {
  if (!keep) return Tensor();
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  std::memcpy(c.raw(), t.raw(), t.nbytes());
  return c;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Nonzero starting values: the ops accumulate into parameter gradients.
Tensor grad0(const Shape& shape, uint64_t seed) {
  return make(shape, DType::F32, randn(size_t(shape_numel(shape)), seed));
}

class GradSkip : public ::testing::TestWithParam<DType> {};

TEST_P(GradSkip, Linear) {
  const DType t = GetParam();
  const int64_t N = 37, in = 48, out = 80;
  Tensor x = make({N, in}, t, randn(size_t(N * in), 1)), w = make({out, in}, t, randn(out * in, 2));
  Tensor dy = make({N, out}, t, randn(size_t(N * out), 3));
  Tensor dw_all = grad0({out, in}, 4), db_all = grad0({out}, 5);
  Tensor dx_all = Tensor::empty({N, in}, t);
  Tensor dw_keep = copy_if(dw_all, true), db_keep = copy_if(db_all, true);
  ops::linear_backward(dx_all, dw_all, db_all, dy, x, w);
  for (bool want_dw : {true, false}) {
    for (bool want_db : {true, false}) {
      SCOPED_TRACE(testing::Message() << dtype_name(t) << " dw=" << want_dw << " db=" << want_db);
      Tensor dw = copy_if(dw_keep, want_dw), db = copy_if(db_keep, want_db);
      Tensor dx = Tensor::empty({N, in}, t);
      ops::linear_backward(dx, dw, db, dy, x, w);
      EXPECT_TRUE(same_bytes(dx, dx_all));
      EXPECT_TRUE(!want_dw || same_bytes(dw, dw_all));
      EXPECT_TRUE(!want_db || same_bytes(db, db_all));
    }
  }
  // Neither dx nor any gradient wanted: nothing to do, and no error.
  ops::linear_backward(Tensor(), Tensor(), Tensor(), dy, x, w);
}

TEST_P(GradSkip, LayerNorm) {
  const DType t = GetParam();
  const int64_t N = 29, C = 72;
  Tensor x = make({N, C}, t, randn(size_t(N * C), 11)), w = make({C}, t, randn(C, 12));
  Tensor b = make({C}, t, randn(C, 13)), dy = make({N, C}, t, randn(size_t(N * C), 14));
  Tensor y = Tensor::empty({N, C}, t), mean = Tensor::empty({N}, DType::F32);
  Tensor rstd = Tensor::empty({N}, DType::F32);
  ops::layernorm_forward(y, mean, rstd, x, w, b, 1e-5f);
  Tensor dx0 = make({N, C}, t, randn(size_t(N * C), 15));  // dx accumulates
  Tensor dw_all = grad0({C}, 16), db_all = grad0({C}, 17), dx_all = copy_if(dx0, true);
  Tensor dw_keep = copy_if(dw_all, true), db_keep = copy_if(db_all, true);
  ops::layernorm_backward(dx_all, dw_all, db_all, dy, x, w, mean, rstd);
  for (bool want_dw : {true, false}) {
    for (bool want_db : {true, false}) {
      SCOPED_TRACE(testing::Message() << dtype_name(t) << " dw=" << want_dw << " db=" << want_db);
      Tensor dw = copy_if(dw_keep, want_dw), db = copy_if(db_keep, want_db);
      Tensor dx = copy_if(dx0, true);
      ops::layernorm_backward(dx, dw, db, dy, x, w, mean, rstd);
      EXPECT_TRUE(same_bytes(dx, dx_all));
      EXPECT_TRUE(!want_dw || same_bytes(dw, dw_all));
      EXPECT_TRUE(!want_db || same_bytes(db, db_all));
    }
  }
}

TEST_P(GradSkip, RmsNorm) {
  const DType t = GetParam();
  const int64_t N = 29, C = 72;
  Tensor x = make({N, C}, t, randn(size_t(N * C), 21)), w = make({C}, t, randn(C, 22));
  Tensor dy = make({N, C}, t, randn(size_t(N * C), 23));
  Tensor y = Tensor::empty({N, C}, t), rstd = Tensor::empty({N}, DType::F32);
  ops::rmsnorm_forward(y, rstd, x, w, 1e-5f);
  Tensor dx0 = make({N, C}, t, randn(size_t(N * C), 24));
  Tensor dw_all = grad0({C}, 25), dx_all = copy_if(dx0, true);
  ops::rmsnorm_backward(dx_all, dw_all, dy, x, w, rstd);
  Tensor dx = copy_if(dx0, true);
  ops::rmsnorm_backward(dx, Tensor(), dy, x, w, rstd);
  EXPECT_TRUE(same_bytes(dx, dx_all));
}

TEST_P(GradSkip, Embedding) {
  const DType t = GetParam();
  const int64_t B = 3, T = 7, C = 40, V = 11, maxT = 9;
  std::vector<double> ids(B * T), pos(B * T);
  for (int64_t n = 0; n < B * T; ++n) {
    ids[n] = double((n * 5 + 2) % V);  // repeats: the scatter has collisions
    pos[n] = double(n % 4);            // packed rows: positions restart
  }
  Tensor tokens = make({B, T}, DType::I32, ids), positions = make({B, T}, DType::I32, pos);
  Tensor dout = make({B, T, C}, t, randn(size_t(B * T * C), 31));
  for (bool packed : {false, true}) {
    SCOPED_TRACE(testing::Message() << dtype_name(t) << " packed=" << packed);
    const Tensor p = packed ? positions : Tensor();
    Tensor dwte_all = grad0({V, C}, 32), dwpe_all = grad0({maxT, C}, 33);
    Tensor dwte_keep = copy_if(dwte_all, true), dwpe_keep = copy_if(dwpe_all, true);
    ops::embedding_backward(dwte_all, dwpe_all, dout, tokens, p);
    Tensor dwte = copy_if(dwte_keep, true), dwpe = copy_if(dwpe_keep, true);
    ops::embedding_backward(dwte, Tensor(), dout, tokens, p);
    EXPECT_TRUE(same_bytes(dwte, dwte_all));
    ops::embedding_backward(Tensor(), dwpe, dout, tokens, p);
    EXPECT_TRUE(same_bytes(dwpe, dwpe_all));
    ops::embedding_backward(Tensor(), Tensor(), dout, tokens, p);  // both frozen: a no-op
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GradSkip, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace nk
