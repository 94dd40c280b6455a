// LayerNorm / RMSNorm: reference backward vs finite differences, the ops on
// every backend vs the double reference (f32, bf16), accumulation, skipped
// parameter gradients and determinism.
#include <gtest/gtest-spi.h>

#include "core/parallel.h"
#include "ops/op_harness.h"
#include "ops/ops.h"
#include "ops/ref/norm.h"

namespace nk {
namespace {

using namespace test;  // the op harness: make, randn, expect_close, ...
using Vec = std::vector<double>;

// ---- finite differences on the reference, in double ----

struct LnCase {
  int64_t N, C;
  Vec x, w, b, dy;
  LnCase(int64_t n, int64_t c, uint64_t seed) : N(n), C(c) {
    x = randn(N * C, seed);
    w = randn(C, seed + 1);
    b = randn(C, seed + 2);
    dy = randn(N * C, seed + 3);
  }
  double ln_loss(const Vec& xx, const Vec& ww, const Vec& bb) const {
    Vec y(N * C), m(N), r(N);
    ref::layernorm_forward(y.data(), m.data(), r.data(), xx.data(), ww.data(), bb.data(), N, C,
                           1e-5);
    return dot(y, dy);
  }
  double rms_loss(const Vec& xx, const Vec& ww) const {
    Vec y(N * C), r(N);
    ref::rmsnorm_forward(y.data(), r.data(), xx.data(), ww.data(), N, C, 1e-5);
    return dot(y, dy);
  }
};

TEST(NormRef, LayerNormBackwardMatchesFiniteDifferences) {
  LnCase k(3, 13, 10);
  Vec y(k.N * k.C), m(k.N), r(k.N), dx(k.N * k.C), dw(k.C), db(k.C);
  ref::layernorm_forward(y.data(), m.data(), r.data(), k.x.data(), k.w.data(), k.b.data(), k.N, k.C,
                         1e-5);
  ref::layernorm_backward(dx.data(), dw.data(), db.data(), k.dy.data(), k.x.data(), k.w.data(),
                          m.data(), r.data(), k.N, k.C);
  check_grad_fd([&](const Vec& v) { return k.ln_loss(v, k.w, k.b); }, k.x, dx, "ln dx");
  check_grad_fd([&](const Vec& v) { return k.ln_loss(k.x, v, k.b); }, k.w, dw, "ln dw");
  check_grad_fd([&](const Vec& v) { return k.ln_loss(k.x, k.w, v); }, k.b, db, "ln db");
}

TEST(NormRef, RmsNormBackwardMatchesFiniteDifferences) {
  LnCase k(4, 9, 20);
  Vec y(k.N * k.C), r(k.N), dx(k.N * k.C), dw(k.C);
  ref::rmsnorm_forward(y.data(), r.data(), k.x.data(), k.w.data(), k.N, k.C, 1e-5);
  ref::rmsnorm_backward(dx.data(), dw.data(), k.dy.data(), k.x.data(), k.w.data(), r.data(), k.N,
                        k.C);
  check_grad_fd([&](const Vec& v) { return k.rms_loss(v, k.w); }, k.x, dx, "rms dx");
  check_grad_fd([&](const Vec& v) { return k.rms_loss(k.x, v); }, k.w, dw, "rms dw");
}

// The FD check must catch a plausible bug: LayerNorm's dx without the mean(g) term.
void fd_on_layernorm_without_mean_term() {
  LnCase k(2, 8, 30);
  Vec y(k.N * k.C), m(k.N), r(k.N), dx(k.N * k.C), dw(k.C);
  ref::layernorm_forward(y.data(), m.data(), r.data(), k.x.data(), k.w.data(), k.b.data(), k.N, k.C,
                         1e-5);
  // RMSNorm's formula on centred inputs is exactly "LayerNorm without mean(g)".
  Vec xc(k.N * k.C);
  for (int64_t n = 0; n < k.N; ++n)
    for (int64_t c = 0; c < k.C; ++c) xc[n * k.C + c] = k.x[n * k.C + c] - m[n];
  ref::rmsnorm_backward(dx.data(), dw.data(), k.dy.data(), xc.data(), k.w.data(), r.data(), k.N,
                        k.C);
  check_grad_fd([&](const Vec& v) { return k.ln_loss(v, k.w, k.b); }, k.x, dx, "wrong dx");
}

TEST(NormRef, FiniteDifferencesCatchAWrongGradient) {
  testing::TestPartResultArray failures;
  {
    testing::ScopedFakeTestPartResultReporter capture(
        testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    fd_on_layernorm_without_mean_term();
  }
  EXPECT_GT(failures.size(), 0) << "the wrong gradient passed the finite-difference check";
}

// ---- the op on every backend vs double reference ----

class NormFast : public BackendTest {};
NK_INSTANTIATE_BACKENDS(NormFast);

struct Sizes {
  int64_t N, C;
};
const Sizes kSizes[] = {{1, 7}, {5, 33}, {17, 130}, {64, 768}};

void layernorm_vs_ref(Device dev, DType dt, Sizes s, bool with_bias) {
  SCOPED_TRACE(testing::Message() << dtype_name(dt) << " N=" << s.N << " C=" << s.C
                                  << " bias=" << with_bias);
  const int64_t N = s.N, C = s.C;
  Vec x = rounded(randn(N * C, 1, 2.0), dt), w = rounded(randn(C, 2), dt);
  Vec b = with_bias ? rounded(randn(C, 3), dt) : Vec(C, 0.0);
  Vec dy = rounded(randn(N * C, 4), dt), dx0 = rounded(randn(N * C, 5), dt);
  Vec dw0 = randn(C, 6), db0 = randn(C, 7);  // nonzero: gradients accumulate
  Tensor tx = make({N, C}, dt, x, dev), tw = make({C}, dt, w, dev);
  Tensor tb = with_bias ? make({C}, dt, b, dev) : Tensor();
  Tensor ty = Tensor::empty({N, C}, dt, dev), tm = Tensor::empty({N}, DType::F32, dev),
         tr = Tensor::empty({N}, DType::F32, dev);
  ops::layernorm_forward(ty, tm, tr, tx, tw, tb, 1e-5f);
  Tensor tdx = make({N, C}, dt, dx0, dev), tdw = make({C}, DType::F32, dw0, dev),
         tdb = make({C}, DType::F32, db0, dev);
  ops::layernorm_backward(tdx, tdw, with_bias ? tdb : Tensor(), make({N, C}, dt, dy, dev), tx, tw,
                          tm, tr);

  Vec y(N * C), m(N), r(N), dx = dx0, dw = dw0, db = db0;
  ref::layernorm_forward(y.data(), m.data(), r.data(), x.data(), w.data(), b.data(), N, C, 1e-5);
  // The reference uses its own stats, so a wrong saved mean/rstd also shows in dx.
  ref::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), m.data(),
                          r.data(), N, C);
  auto tol = tol_for(dt);
  expect_close(values(ty), y, tol, "y");
  // mean/rstd are f32 in both dtypes: only summation order differs.
  expect_close(values(tm), m, tol_for(DType::F32), "mean");
  expect_close(values(tr), r, tol_for(DType::F32), "rstd");
  expect_close(values(tdx), dx, tol, "dx");
  // dw/db are f32 sums of products of exact (dtype-rounded) inputs: the bf16
  // case only adds fp32 accumulation error, so f32 tolerances hold.
  expect_close(values(tdw), dw, {1e-4, 1e-4}, "dw");
  if (with_bias) expect_close(values(tdb), db, {1e-4, 1e-4}, "db");
  if (!with_bias) expect_close(values(tdb), rounded(db0, DType::F32), {0, 0}, "db untouched");
}

NK_COVERS(NormFast, LayerNormMatchesReference, layernorm_forward, layernorm_backward);
TEST_P(NormFast, LayerNormMatchesReference) {
  for (DType dt : {DType::F32, DType::BF16})
    for (Sizes s : kSizes) {
      layernorm_vs_ref(dev(), dt, s, true);
      layernorm_vs_ref(dev(), dt, s, false);
    }
}

void rmsnorm_vs_ref(Device dev, DType dt, Sizes s) {
  SCOPED_TRACE(testing::Message() << dtype_name(dt) << " N=" << s.N << " C=" << s.C);
  const int64_t N = s.N, C = s.C;
  Vec x = rounded(randn(N * C, 11, 2.0), dt), w = rounded(randn(C, 12), dt);
  Vec dy = rounded(randn(N * C, 13), dt), dx0 = rounded(randn(N * C, 14), dt);
  Vec dw0 = randn(C, 15);
  Tensor tx = make({N, C}, dt, x, dev), tw = make({C}, dt, w, dev);
  Tensor ty = Tensor::empty({N, C}, dt, dev), tr = Tensor::empty({N}, DType::F32, dev);
  ops::rmsnorm_forward(ty, tr, tx, tw, 1e-6f);
  Tensor tdx = make({N, C}, dt, dx0, dev), tdw = make({C}, DType::F32, dw0, dev);
  ops::rmsnorm_backward(tdx, tdw, make({N, C}, dt, dy, dev), tx, tw, tr);

  Vec y(N * C), r(N), dx = dx0, dw = dw0;
  ref::rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), N, C, 1e-6);
  ref::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), r.data(), N, C);
  auto tol = tol_for(dt);
  expect_close(values(ty), y, tol, "y");
  expect_close(values(tr), r, tol_for(DType::F32), "rstd");
  expect_close(values(tdx), dx, tol, "dx");
  expect_close(values(tdw), dw, {1e-4, 1e-4}, "dw");  // f32 sums, as for LayerNorm
}

NK_COVERS(NormFast, RmsNormMatchesReference, rmsnorm_forward, rmsnorm_backward);
TEST_P(NormFast, RmsNormMatchesReference) {
  for (DType dt : {DType::F32, DType::BF16})
    for (Sizes s : kSizes) rmsnorm_vs_ref(dev(), dt, s);
}

TEST_P(NormFast, ThreeDimensionalInput) {
  const int64_t B = 2, T = 3, C = 20;
  Vec x = randn(B * T * C, 40), w = randn(C, 41);
  Tensor ty = Tensor::empty({B, T, C}, DType::F32, dev()),
         tr = Tensor::empty({B * T}, DType::F32, dev());
  ops::rmsnorm_forward(ty, tr, make({B, T, C}, DType::F32, x, dev()),
                       make({C}, DType::F32, w, dev()), 1e-5f);
  Vec y(B * T * C), r(B * T);
  ref::rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), B * T, C, 1e-5);
  expect_close(values(ty), y, tol_for(DType::F32), "y");
}

// Parameter-gradient sums must not depend on the thread count.
TEST_P(NormFast, BackwardIsBitIdenticalAcrossThreadCounts) {
  const int64_t N = 301, C = 200;
  const Device d = dev();
  Tensor x = make({N, C}, DType::BF16, randn(N * C, 50), d),
         w = make({C}, DType::BF16, randn(C, 51), d);
  Tensor b = make({C}, DType::BF16, randn(C, 52), d),
         dy = make({N, C}, DType::BF16, randn(N * C, 53), d);
  Tensor y = Tensor::empty({N, C}, DType::BF16, d), m = Tensor::empty({N}, DType::F32, d),
         r = Tensor::empty({N}, DType::F32, d);
  ops::layernorm_forward(y, m, r, x, w, b, 1e-5f);
  std::vector<Vec> results;
  const int saved = num_threads();
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tensor dx = make({N, C}, DType::BF16, Vec(N * C), d), dw = make({C}, DType::F32, Vec(C), d),
           db = make({C}, DType::F32, Vec(C), d);
    ops::layernorm_backward(dx, dw, db, dy, x, w, m, r);
    Vec all = values(dx);
    for (double v : values(dw)) all.push_back(v);
    for (double v : values(db)) all.push_back(v);
    results.push_back(all);
  }
  set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

// Frozen parameters: an undefined dw or db is not computed; dx and the
// gradients that are computed are bit-identical to a call computing all.
TEST_P(NormFast, SkippedParameterGradientsLeaveTheOthersUnchanged) {
  const int64_t N = 37, C = 130;
  const Device d = dev();
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = make({N, C}, dt, randn(N * C, 60, 2.0), d), w = make({C}, dt, randn(C, 61), d);
    Tensor b = make({C}, dt, randn(C, 62), d), dy = make({N, C}, dt, randn(N * C, 63), d);
    const Vec dx0 = randn(N * C, 64), dw0 = randn(C, 65), db0 = randn(C, 66);
    Tensor y = Tensor::empty({N, C}, dt, d), m = Tensor::empty({N}, DType::F32, d),
           r = Tensor::empty({N}, DType::F32, d);
    // LayerNorm: every subset of {dw, db}.
    ops::layernorm_forward(y, m, r, x, w, b, 1e-5f);
    auto ln = [&](bool want_dw, bool want_db) {
      Tensor dx = make({N, C}, dt, dx0, d);
      Tensor dw = want_dw ? make({C}, DType::F32, dw0, d) : Tensor();
      Tensor db = want_db ? make({C}, DType::F32, db0, d) : Tensor();
      ops::layernorm_backward(dx, dw, db, dy, x, w, m, r);
      return std::vector<Vec>{values(dx), want_dw ? values(dw) : Vec(),
                              want_db ? values(db) : Vec()};
    };
    const auto all = ln(true, true);
    for (auto [want_dw, want_db] : {std::pair{false, true}, {true, false}, {false, false}}) {
      SCOPED_TRACE(testing::Message() << "layernorm dw=" << want_dw << " db=" << want_db);
      const auto got = ln(want_dw, want_db);
      EXPECT_EQ(got[0], all[0]) << "dx";
      if (want_dw) {
        EXPECT_EQ(got[1], all[1]) << "dw";
      }
      if (want_db) {
        EXPECT_EQ(got[2], all[2]) << "db";
      }
    }
    // RMSNorm: dw skipped.
    ops::rmsnorm_forward(y, r, x, w, 1e-6f);
    auto rms = [&](bool want_dw) {
      Tensor dx = make({N, C}, dt, dx0, d);
      Tensor dw = want_dw ? make({C}, DType::F32, dw0, d) : Tensor();
      ops::rmsnorm_backward(dx, dw, dy, x, w, r);
      return values(dx);
    };
    EXPECT_EQ(rms(false), rms(true)) << "rmsnorm dx";
  }
}

TEST_P(NormFast, RejectsMismatchedShapes) {
  Tensor x = Tensor::empty({4, 8}, DType::F32, dev()), w = Tensor::empty({7}, DType::F32, dev());
  Tensor y = Tensor::empty({4, 8}, DType::F32, dev()), r = Tensor::empty({4}, DType::F32, dev());
  EXPECT_THROW(ops::rmsnorm_forward(y, r, x, w, 1e-5f), InternalError);
}

}  // namespace
}  // namespace nk
