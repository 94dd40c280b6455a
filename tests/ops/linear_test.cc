// linear_forward / linear_backward on every backend against the double
// reference (src/ops/ref/linear.h), skipped gradients, and the reference's
// backward against finite differences.
#include <cmath>
#include <cstring>

#include "core/parallel.h"
#include "op_harness.h"
#include "ops/cpu/dnnl_matmul.h"
#include "ops/ops.h"
#include "ops/ref/linear.h"

namespace nk {
namespace {

using namespace test;  // the op harness: make, randn, expect_close, ...

struct Shape3 {
  int64_t n, in, out;
};

// Inputs already rounded to the op's dtype, so the reference sees what the op sees.
struct Inputs {
  std::vector<double> x, w, b, dy, dw0, db0;
};

Inputs make_inputs(Shape3 s, DType t, uint64_t seed) {
  Inputs in;
  in.x = rounded(randn(size_t(s.n * s.in), seed), t);
  in.w = rounded(randn(size_t(s.out * s.in), seed + 1, 1.0 / std::sqrt(double(s.in))), t);
  in.b = rounded(randn(size_t(s.out), seed + 2), t);
  in.dy = rounded(randn(size_t(s.n * s.out), seed + 3), t);
  // Gradients start nonzero: the op must accumulate into them, not overwrite.
  in.dw0 = rounded(randn(size_t(s.out * s.in), seed + 4), DType::F32);
  in.db0 = rounded(randn(size_t(s.out), seed + 5), DType::F32);
  return in;
}

class Linear : public BackendTest {};
NK_INSTANTIATE_BACKENDS(Linear);

// Runs the op on `dev` and the reference on the same inputs and compares y, dx, dw, db.
void check_against_reference(Device dev, Shape3 s, DType t, bool bias, bool want_dx,
                             uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << dtype_name(t) << " N=" << s.n << " in=" << s.in
                                    << " out=" << s.out << " bias=" << bias << " dx=" << want_dx);
  Inputs in = make_inputs(s, t, seed);
  Tensor x = make({s.n, s.in}, t, in.x, dev), w = make({s.out, s.in}, t, in.w, dev);
  Tensor b = bias ? make({s.out}, t, in.b, dev) : Tensor();
  Tensor y = Tensor::empty({s.n, s.out}, t, dev);
  ops::linear_forward(y, x, w, b);

  std::vector<double> y_ref(size_t(s.n * s.out));
  ref::linear_forward(y_ref.data(), in.x.data(), in.w.data(), bias ? in.b.data() : nullptr, s.n,
                      s.in, s.out);
  expect_close(values(y), y_ref, tol_for(t), "y");

  Tensor dy = make({s.n, s.out}, t, in.dy, dev);
  Tensor dx = want_dx ? Tensor::empty({s.n, s.in}, t, dev) : Tensor();
  Tensor dw = make({s.out, s.in}, DType::F32, in.dw0, dev);
  Tensor db = bias ? make({s.out}, DType::F32, in.db0, dev) : Tensor();
  ops::linear_backward(dx, dw, db, dy, x, w);

  std::vector<double> dx_ref(size_t(s.n * s.in)), dw_ref = in.dw0, db_ref = in.db0;
  ref::linear_backward(want_dx ? dx_ref.data() : nullptr, dw_ref.data(),
                       bias ? db_ref.data() : nullptr, in.dy.data(), in.x.data(), in.w.data(), s.n,
                       s.in, s.out);
  if (want_dx) expect_close(values(dx), dx_ref, tol_for(t), "dx");
  // dw and db are f32 outputs: bf16 x bf16 products are exact in fp32 and the
  // sums run in fp32, so only accumulation order differs from the reference,
  // whatever the input dtype. Hence the f32 tolerance for both.
  expect_close(values(dw), dw_ref, tol_for(DType::F32), "dw");
  if (bias) expect_close(values(db), db_ref, tol_for(DType::F32), "db");
}

const Shape3 kShapes[] = {{1, 3, 5}, {1, 64, 32}, {3, 5, 7}, {37, 129, 65}, {128, 256, 96}};

NK_COVERS(Linear, MatchesReferenceF32, linear_forward, linear_backward);
TEST_P(Linear, MatchesReferenceF32) {
  uint64_t seed = 1;
  for (Shape3 s : kShapes)
    for (bool bias : {false, true})
      for (bool dx : {false, true})
        check_against_reference(dev(), s, DType::F32, bias, dx, seed += 10);
}

TEST_P(Linear, MatchesReferenceBF16) {
  uint64_t seed = 100;
  for (Shape3 s : kShapes)
    for (bool bias : {false, true})
      for (bool dx : {false, true})
        check_against_reference(dev(), s, DType::BF16, bias, dx, seed += 10);
}

// The f32 fallback for CPUs where oneDNN has no bf16 product (before
// AVX-512), forced so that every CPU checks it: the same reference, the same
// tolerance, and primitives still cached after the first call.
TEST(LinearCpu, Bf16FallbackMatchesReference) {
  ops::cpu::dnnl_matmul_force_fallback(true);
  uint64_t seed = 700;
  for (Shape3 s : kShapes)
    for (bool bias : {false, true})
      for (bool dx : {false, true})
        check_against_reference(Device::CPU, s, DType::BF16, bias, dx, seed += 10);
  const size_t cached = ops::cpu::dnnl_matmul_cache_size();
  check_against_reference(Device::CPU, kShapes[0], DType::BF16, true, true, 700);
  EXPECT_EQ(ops::cpu::dnnl_matmul_cache_size(), cached);
  ops::cpu::dnnl_matmul_force_fallback(false);
}

// Products of many rows that are not a multiple of 64 run as two
// (dnnl_matmul.h): the forward's and dx's over N = 4161 rows of x (A's rows
// with their stride), dw's over out = 4133 rows (A = dy^T, a column range of
// dy's rows), each against the reference, in f32 and bf16; and the emulated
// bf16 product (f32 copies, which runs them whole) on the same shapes.
TEST(LinearCpu, ManyRowsNotAMultipleOf64MatchTheReference) {
  const Shape3 shapes[] = {{4161, 24, 40}, {9, 40, 4133}};
  uint64_t seed = 900;
  for (bool emulated : {false, true}) {
    ops::cpu::dnnl_matmul_force_fallback(emulated);
    for (Shape3 s : shapes)
      for (DType t : {DType::F32, DType::BF16})
        check_against_reference(Device::CPU, s, t, true, true, seed += 10);
  }
  ops::cpu::dnnl_matmul_force_fallback(false);
}

// Products whose shape changes every call (a MoE layer's experts' rows,
// prompts of every length) keep at most the cache's capacity of primitives,
// the least recently used dropped; a product whose primitive was dropped
// gives the same bits when made again. Run on the emulated bf16 product
// (f32 copies in the thread's scratch) and on f32.
TEST(LinearCpu, ProductCacheKeepsTheMostRecentlyUsed) {
  for (DType t : {DType::BF16, DType::F32}) {
    ops::cpu::dnnl_matmul_force_fallback(t == DType::BF16);
    const size_t old = ops::cpu::dnnl_matmul_set_cache_capacity(8);
    const Tensor w = make({24, 32}, t, randn(24 * 32, 81, 0.2), Device::CPU);
    auto product = [&](int64_t m) {
      Tensor y = Tensor::empty({m, 24}, t);
      ops::linear_forward(y, make({m, 32}, t, randn(size_t(m * 32), uint64_t(90 + m)), Device::CPU),
                          w, Tensor());
      return values(y);
    };
    std::vector<std::vector<double>> first;
    for (int64_t m = 1; m <= 40; ++m) first.push_back(product(m));
    EXPECT_LE(ops::cpu::dnnl_matmul_cache_size(), 8u) << dtype_name(t);
    for (int64_t m = 1; m <= 40; ++m) EXPECT_EQ(product(m), first[size_t(m - 1)]) << m;
    // The 8 most recent stay: running them again adds none.
    const size_t kept = ops::cpu::dnnl_matmul_cache_size();
    for (int64_t m = 33; m <= 40; ++m) product(m);
    EXPECT_EQ(ops::cpu::dnnl_matmul_cache_size(), kept);
    ops::cpu::dnnl_matmul_set_cache_capacity(old);
    ops::cpu::dnnl_matmul_force_fallback(false);
  }
}

// Frozen parameters: any of dx, dw, db left undefined is not computed, and
// the ones that are computed are bit-identical to a call computing all three.
TEST_P(Linear, SkippedGradientsLeaveTheOthersUnchanged) {
  const Shape3 s{37, 129, 65};
  for (DType t : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    Inputs in = make_inputs(s, t, 41);
    Tensor x = make({s.n, s.in}, t, in.x, dev()), w = make({s.out, s.in}, t, in.w, dev());
    Tensor dy = make({s.n, s.out}, t, in.dy, dev());
    auto run = [&](bool want_dx, bool want_dw, bool want_db) {
      Tensor dx = want_dx ? Tensor::empty({s.n, s.in}, t, dev()) : Tensor();
      Tensor dw = want_dw ? make({s.out, s.in}, DType::F32, in.dw0, dev()) : Tensor();
      Tensor db = want_db ? make({s.out}, DType::F32, in.db0, dev()) : Tensor();
      ops::linear_backward(dx, dw, db, dy, x, w);
      return std::vector<std::vector<double>>{want_dx ? values(dx) : std::vector<double>(),
                                              want_dw ? values(dw) : std::vector<double>(),
                                              want_db ? values(db) : std::vector<double>()};
    };
    const auto all = run(true, true, true);
    for (int mask = 0; mask < 7; ++mask) {
      const bool want[3] = {bool(mask & 1), bool(mask & 2), bool(mask & 4)};
      SCOPED_TRACE(::testing::Message()
                   << "dx=" << want[0] << " dw=" << want[1] << " db=" << want[2]);
      const auto got = run(want[0], want[1], want[2]);
      for (int k = 0; k < 3; ++k)
        if (want[k]) {
          EXPECT_EQ(got[size_t(k)], all[size_t(k)]) << "output " << k;
        }
    }
  }
}

// A bf16 layer may keep an f32 bias (oneDNN takes either).
TEST_P(Linear, BF16WithF32Bias) {
  Shape3 s{9, 17, 11};
  Inputs in = make_inputs(s, DType::BF16, 7);
  Tensor y = Tensor::empty({s.n, s.out}, DType::BF16, dev());
  ops::linear_forward(y, make({s.n, s.in}, DType::BF16, in.x, dev()),
                      make({s.out, s.in}, DType::BF16, in.w, dev()),
                      make({s.out}, DType::F32, in.b, dev()));
  std::vector<double> y_ref(size_t(s.n * s.out));
  ref::linear_forward(y_ref.data(), in.x.data(), in.w.data(), in.b.data(), s.n, s.in, s.out);
  expect_close(values(y), y_ref, tol_for(DType::BF16), "y");
}

// Two backward calls sum into dw/db (micro-batch accumulation); dx is overwritten.
TEST_P(Linear, BackwardAccumulatesAcrossCalls) {
  Shape3 s{6, 10, 4};
  Inputs in = make_inputs(s, DType::F32, 3);
  Tensor x = make({s.n, s.in}, DType::F32, in.x, dev()),
         w = make({s.out, s.in}, DType::F32, in.w, dev());
  Tensor dy = make({s.n, s.out}, DType::F32, in.dy, dev());
  Tensor dx = make({s.n, s.in}, DType::F32, randn(size_t(s.n * s.in), 9),
                   dev());  // garbage to overwrite
  Tensor dw = make({s.out, s.in}, DType::F32, in.dw0, dev()),
         db = make({s.out}, DType::F32, in.db0, dev());
  ops::linear_backward(dx, dw, db, dy, x, w);
  ops::linear_backward(dx, dw, db, dy, x, w);

  std::vector<double> dx_ref(size_t(s.n * s.in)), dw_ref = in.dw0, db_ref = in.db0;
  for (int rep = 0; rep < 2; ++rep)
    ref::linear_backward(dx_ref.data(), dw_ref.data(), db_ref.data(), in.dy.data(), in.x.data(),
                         in.w.data(), s.n, s.in, s.out);
  expect_close(values(dx), dx_ref, tol_for(DType::F32), "dx");
  expect_close(values(dw), dw_ref, tol_for(DType::F32), "dw");
  expect_close(values(db), db_ref, tol_for(DType::F32), "db");
}

// [B,T,C] activations and narrow0 views (micro-batch slices) are dense rows too.
TEST_P(Linear, AcceptsBatchedShapesAndRowViews) {
  const int64_t B = 3, T = 5, in = 8, out = 6;
  std::vector<double> xv = randn(size_t(B * T * in), 11), wv = randn(size_t(out * in), 12);
  Tensor x = make({B, T, in}, DType::F32, xv, dev()), w = make({out, in}, DType::F32, wv, dev());
  Tensor y = Tensor::empty({B, T, out}, DType::F32, dev());
  ops::linear_forward(y, x, w, Tensor());
  std::vector<double> y_ref(size_t(B * T * out));
  ref::linear_forward(y_ref.data(), xv.data(), wv.data(), (const double*)nullptr, B * T, in, out);
  expect_close(values(y), y_ref, tol_for(DType::F32), "y");

  // Batch row 1 only: rows [T, 2T) of the flattened problem.
  Tensor y1 = make({B, T, out}, DType::F32, std::vector<double>(size_t(B * T * out)), dev());
  ops::linear_forward(y1.narrow0(1, 1), x.narrow0(1, 1), w, Tensor());
  std::vector<double> got = values(y1);
  for (int64_t i = 0; i < B * T * out; ++i) {
    double want = (i >= T * out && i < 2 * T * out) ? y_ref[size_t(i)] : 0.0;
    EXPECT_NEAR(got[size_t(i)], want, 1e-5 + 1e-4 * std::fabs(want)) << i;
  }
}

TEST_P(Linear, RejectsMismatchedShapesAndDtypes) {
  const Device d = dev();
  Tensor x = Tensor::empty({4, 8}, DType::F32, d), w = Tensor::empty({6, 8}, DType::F32, d);
  EXPECT_THROW(ops::linear_forward(Tensor::empty({4, 5}, DType::F32, d), x, w, Tensor()),
               InternalError);
  EXPECT_THROW(ops::linear_forward(Tensor::empty({4, 6}, DType::BF16, d), x, w, Tensor()),
               InternalError);
  EXPECT_THROW(ops::linear_forward(Tensor::empty({4, 6}, DType::F32, d), x, w,
                                   Tensor::empty({5}, DType::F32, d)),
               InternalError);
  Tensor dy = Tensor::empty({4, 6}, DType::F32, d);
  EXPECT_THROW(
      ops::linear_backward(Tensor(), Tensor::empty({6, 8}, DType::BF16, d), Tensor(), dy, x, w),
      InternalError);
}

// After a first "step" over a set of shapes, repeating it creates no oneDNN
// primitives (a property of the CPU backend).
TEST(LinearCpu, PrimitivesAreCachedAfterFirstStep) {
  auto step = [] {
    for (DType t : {DType::F32, DType::BF16}) {
      Tensor x = Tensor::zeros({16, 24}, t), w = Tensor::zeros({40, 24}, t);
      Tensor y = Tensor::empty({16, 40}, t), dx = Tensor::empty({16, 24}, t);
      Tensor dw = Tensor::zeros({40, 24}, DType::F32), db = Tensor::zeros({40}, DType::F32);
      ops::linear_forward(y, x, w, Tensor::zeros({40}, t));
      ops::linear_backward(dx, dw, db, y, x, w);
    }
  };
  step();
  size_t after_first = ops::cpu::dnnl_matmul_cache_size();
  step();
  step();
  EXPECT_EQ(ops::cpu::dnnl_matmul_cache_size(), after_first);
}

// The bias gradient is bitwise identical for any thread count.
TEST_P(Linear, BiasGradientIsDeterministicAcrossThreadCounts) {
  const int64_t n = 1000, in = 4, out = 300;
  Tensor x = make({n, in}, DType::F32, std::vector<double>(size_t(n * in)), dev()),
         w = make({out, in}, DType::F32, std::vector<double>(size_t(out * in)), dev());
  Tensor dy = make({n, out}, DType::F32, randn(size_t(n * out), 21), dev());
  const int saved = num_threads();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tensor dw = make({out, in}, DType::F32, std::vector<double>(size_t(out * in)), dev()),
           db = make({out}, DType::F32, std::vector<double>(size_t(out)), dev());
    ops::linear_backward(Tensor(), dw, db, dy, x, w);
    const Tensor h = to_host(db);
    results.emplace_back(h.data<float>(), h.data<float>() + out);
  }
  set_num_threads(saved);
  for (size_t i = 1; i < results.size(); ++i)
    EXPECT_EQ(std::memcmp(results[0].data(), results[i].data(), size_t(out) * 4), 0);
}

// The reference backward is the derivative of the reference forward:
// L = sum(y * dy) has dL/dx = dx, dL/dw = dw, dL/db = db.
TEST(LinearRef, BackwardMatchesFiniteDifferences) {
  const int64_t n = 4, in = 7, out = 5;
  std::vector<double> x = randn(size_t(n * in), 31), w = randn(size_t(out * in), 32),
                      b = randn(size_t(out), 33), dy = randn(size_t(n * out), 34);
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww,
                  const std::vector<double>& bb) {
    std::vector<double> y(size_t(n * out));
    ref::linear_forward(y.data(), xx.data(), ww.data(), bb.data(), n, in, out);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += y[i] * dy[i];
    return l;
  };
  std::vector<double> dx(size_t(n * in)), dw(size_t(out * in), 0.0), db(size_t(out), 0.0);
  ref::linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), n, in, out);
  test::check_grad_fd([&](const std::vector<double>& v) { return loss(v, w, b); }, x, dx, "dx");
  test::check_grad_fd([&](const std::vector<double>& v) { return loss(x, v, b); }, w, dw, "dw");
  test::check_grad_fd([&](const std::vector<double>& v) { return loss(x, w, v); }, b, db, "db");
}

}  // namespace
}  // namespace nk
