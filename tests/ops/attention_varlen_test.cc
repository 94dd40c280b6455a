// Attention over packed rows (cu_seqlens): reference backward vs finite
// differences; the op on every backend vs the double reference (f32, bf16) over ragged
// document layouts (documents of one token, boundaries on and beside tile
// edges, one document filling the row, empty documents, rows with different
// document counts); and the property packing relies on: a packed row's output
// and gradient equal those of each document run alone.
//
// Tolerances: fast vs reference as in attention_test.cc (test::tol_for: fp32
// accumulation order; bf16 one output rounding). Packed vs alone: the same
// arithmetic on tiles aligned differently, so the fp32 sums change order:
// 1e-5 relative to the tensor's scale in f32 (observed ~1e-7); in bf16 one
// output may round the other way (2^-8), so bf16's test tolerance. The double
// reference, packed vs alone, agrees to 1e-12.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "op_harness.h"
#include "ops/ops.h"
#include "ops/ref/attention.h"

namespace nk {
namespace {

using ref::AttentionDims;
using test::values;

// Per-row cumulative document starts, padded to a common width by repeating T.
struct Layout {
  std::vector<std::vector<int32_t>> rows;  // each 0 = c_0 <= ... <= c_k = T
  int64_t width() const {
    size_t w = 0;
    for (const auto& r : rows) w = std::max(w, r.size());
    return int64_t(w);
  }
  std::vector<int32_t> flat(int64_t T) const {
    std::vector<int32_t> f;
    for (const auto& r : rows) {
      f.insert(f.end(), r.begin(), r.end());
      f.insert(f.end(), size_t(width()) - r.size(), int32_t(T));
    }
    return f;
  }
};

struct RefOut {
  std::vector<double> out, lse;
};

RefOut ref_forward(const AttentionDims& d, const std::vector<double>& qkv, const int32_t* cu,
                   int64_t n_cu) {
  RefOut r{std::vector<double>(d.B * d.T * d.Hq * d.D), std::vector<double>(d.B * d.Hq * d.T)};
  ref::attention_forward(r.out.data(), r.lse.data(), qkv.data(), d, cu, n_cu);
  return r;
}

std::vector<double> ref_backward(const AttentionDims& d, const std::vector<double>& dout,
                                 const std::vector<double>& qkv, const RefOut& f, const int32_t* cu,
                                 int64_t n_cu) {
  std::vector<double> dqkv(qkv.size());
  ref::attention_backward(dqkv.data(), dout.data(), qkv.data(), f.out.data(), f.lse.data(), d, cu,
                          n_cu);
  return dqkv;
}

TEST(AttentionVarlenRef, BackwardMatchesFiniteDifferences) {
  const AttentionDims d{2, 9, 4, 2, 4};
  const Layout l{{{0, 1, 4, 9}, {0, 5, 5, 9}}};  // a 1-token document; an empty one
  const auto cu = l.flat(d.T);
  const auto qkv = test::randn(d.B * d.T * d.row(), 31);
  const auto dout = test::randn(d.B * d.T * d.Hq * d.D, 32);
  const RefOut f = ref_forward(d, qkv, cu.data(), l.width());
  const auto grad = ref_backward(d, dout, qkv, f, cu.data(), l.width());
  auto loss = [&](const std::vector<double>& x) {
    const auto out = ref_forward(d, x, cu.data(), l.width()).out;
    return test::dot(out, dout);
  };
  test::check_grad_fd(loss, qkv, grad, "dqkv", 1e-6, 1e-6, 400);
}

// Outputs of a packed row, per document, against the same document alone
// (B = 1, T = its length) and the gradients likewise. `run` maps (dims, qkv,
// dout, cu or empty) to (out, lse, dqkv).
struct Result {
  std::vector<double> out, lse, dqkv;
};
using Runner = std::function<Result(const AttentionDims&, const std::vector<double>&,
                                    const std::vector<double>&, const std::vector<int32_t>&)>;

void check_packed_equals_alone(const Runner& run, const AttentionDims& d,
                               const std::vector<int32_t>& starts, test::Tol tol, DType dt) {
  ASSERT_EQ(d.B, 1);
  const auto qkv = test::rounded(test::randn(d.T * d.row(), 41 + d.T), dt);
  const auto dout = test::rounded(test::randn(d.T * d.Hq * d.D, 42 + d.T), dt);
  const Result packed = run(d, qkv, dout, starts);
  const int64_t R = d.row(), O = d.Hq * d.D;
  for (size_t k = 0; k + 1 < starts.size(); ++k) {
    const int64_t s = starts[k], n = starts[k + 1] - s;
    if (n == 0) continue;
    SCOPED_TRACE(::testing::Message() << "document [" << s << ", " << s + n << ")");
    const AttentionDims a{1, n, d.Hq, d.Hkv, d.D};
    const std::vector<double> q(qkv.begin() + s * R, qkv.begin() + (s + n) * R);
    const std::vector<double> g(dout.begin() + s * O, dout.begin() + (s + n) * O);
    const Result alone = run(a, q, g, {});
    test::expect_close({packed.out.begin() + s * O, packed.out.begin() + (s + n) * O}, alone.out,
                       tol, "out");
    test::expect_close({packed.dqkv.begin() + s * R, packed.dqkv.begin() + (s + n) * R}, alone.dqkv,
                       tol, "dqkv");
    std::vector<double> lse;
    for (int64_t h = 0; h < d.Hq; ++h)
      for (int64_t t = 0; t < n; ++t) lse.push_back(packed.lse[h * d.T + s + t]);
    test::expect_close(lse, alone.lse, tol, "lse");
  }
}

Result run_ref(const AttentionDims& d, const std::vector<double>& qkv,
               const std::vector<double>& dout, const std::vector<int32_t>& cu) {
  const int32_t* c = cu.empty() ? nullptr : cu.data();
  const RefOut f = ref_forward(d, qkv, c, int64_t(cu.size()) / d.B);
  return {f.out, f.lse, ref_backward(d, dout, qkv, f, c, int64_t(cu.size()) / d.B)};
}

class AttentionVarlenFast : public test::BackendTest {};
NK_INSTANTIATE_BACKENDS(AttentionVarlenFast);

Runner fast_runner(Device dev, DType dt) {
  return [dev, dt](const AttentionDims& d, const std::vector<double>& qkv,
                   const std::vector<double>& dout, const std::vector<int32_t>& cu) {
    Tensor tq = test::make({d.B, d.T, d.row()}, dt, qkv, dev);
    Tensor tdo = test::make({d.B, d.T, d.Hq * d.D}, dt, dout, dev);
    Tensor out = Tensor::empty({d.B, d.T, d.Hq * d.D}, dt, dev);
    Tensor lse = Tensor::empty({d.B, d.Hq, d.T}, DType::F32, dev);
    Tensor dqkv = Tensor::empty({d.B, d.T, d.row()}, dt, dev);
    Tensor tc;
    if (!cu.empty()) tc = test::make_i32({d.B, int64_t(cu.size()) / d.B}, cu, dev);
    ops::attention_forward(out, lse, tq, d.Hq, d.Hkv, tc);
    ops::attention_backward(dqkv, tdo, tq, out, lse, d.Hq, d.Hkv, tc);
    return Result{values(out), values(lse), values(dqkv)};
  };
}

TEST(AttentionVarlenRef, PackedEqualsDocumentsAlone) {
  const AttentionDims d{1, 23, 4, 2, 8};
  check_packed_equals_alone(run_ref, d, {0, 1, 7, 7, 16, 23}, {1e-12, 1e-12}, DType::F64);
}

struct Case {
  int64_t T, Hq, Hkv, D;
  Layout layout;  // B = number of rows
  const char* what;
};

std::vector<Case> cases() {
  return {
      {1, 2, 1, 16, {{{0, 1}}}, "one token"},
      {7, 4, 2, 32, {{{0, 1, 2, 3, 7}, {0, 7}}}, "1-token documents; one document filling a row"},
      {130,
       4,
       1,
       64,
       {{{0, 64, 128, 130}, {0, 63, 65, 130}}},
       "boundaries on and beside tile edges"},
      {200, 2, 2, 32, {{{0, 3, 90, 91, 200}, {0, 200}}}, "documents spanning tiles"},
      {192, 3, 1, 20, {{{0, 100, 100, 150, 192}}}, "empty document, D=20, group 3"},
      {256, 4, 2, 32, {{{0, 64, 128, 192, 256}, {0, 10, 20, 30, 40, 50, 256}}}, "aligned docs"},
  };
}

// Random layouts too: B=2 rows of T=300, 1..8 documents each at random cuts.
Layout random_layout(int64_t B, int64_t T, uint64_t seed) {
  Rng r(seed);
  Layout l;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int32_t> cuts = {0, int32_t(T)};
    const int64_t k = int64_t(r.below(8));
    for (int64_t i = 0; i < k; ++i) cuts.push_back(int32_t(1 + r.below(uint64_t(T - 1))));
    std::sort(cuts.begin(), cuts.end());
    l.rows.push_back(cuts);
  }
  return l;
}

void check_fast(Device dev, const Case& c, DType dt) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << c.what << " T=" << c.T);
  const AttentionDims d{int64_t(c.layout.rows.size()), c.T, c.Hq, c.Hkv, c.D};
  const auto cu = c.layout.flat(d.T);
  const auto qkv = test::rounded(test::randn(d.B * d.T * d.row(), 100 + c.T + c.D), dt);
  const auto dout = test::rounded(test::randn(d.B * d.T * d.Hq * d.D, 200 + c.T), dt);
  const Result got = fast_runner(dev, dt)(d, qkv, dout, cu);
  const RefOut want = ref_forward(d, qkv, cu.data(), c.layout.width());
  const auto tol = test::tol_for(dt);
  test::expect_close(got.out, want.out, tol, "out");
  test::expect_close(got.lse, want.lse, tol, "lse");
  // The reference backward from the fast forward's own out and lse.
  const auto want_d =
      ref_backward(d, dout, qkv, RefOut{got.out, got.lse}, cu.data(), c.layout.width());
  test::expect_close(got.dqkv, want_d, tol, "dqkv");
}

std::vector<Case> all_cases() {
  auto v = cases();
  for (uint64_t s = 0; s < 4; ++s) v.push_back({300, 4, 2, 32, random_layout(2, 300, s), "random"});
  return v;
}

NK_COVERS(AttentionVarlenFast, MatchesReferenceF32, attention_forward, attention_backward);
TEST_P(AttentionVarlenFast, MatchesReferenceF32) {
  for (const Case& c : all_cases()) check_fast(dev(), c, DType::F32);
}

TEST_P(AttentionVarlenFast, MatchesReferenceBF16) {
  for (const Case& c : all_cases()) check_fast(dev(), c, DType::BF16);
}

TEST_P(AttentionVarlenFast, PackedEqualsDocumentsAloneF32) {
  const AttentionDims d{1, 300, 4, 2, 32};
  for (const std::vector<int32_t>& starts : std::vector<std::vector<int32_t>>{
           {0, 1, 64, 65, 128, 200, 300}, {0, 100, 300}, {0, 300}, {0, 37, 38, 250, 299, 300}})
    check_packed_equals_alone(fast_runner(dev(), DType::F32), d, starts, {1e-5, 1e-6}, DType::F32);
}

TEST_P(AttentionVarlenFast, PackedEqualsDocumentsAloneBF16) {
  const AttentionDims d{1, 300, 4, 2, 32};
  check_packed_equals_alone(fast_runner(dev(), DType::BF16), d, {0, 1, 64, 65, 128, 200, 300},
                            test::tol_for(DType::BF16), DType::BF16);
}

// One document per row through cu_seqlens = [0, T] takes the masked code path
// and must give the plain causal result bit for bit.
TEST_P(AttentionVarlenFast, SingleDocumentIsPlainCausal) {
  const AttentionDims d{2, 150, 4, 2, 32};
  const Layout l{{{0, 150}, {0, 150}}};
  const auto qkv = test::randn(d.B * d.T * d.row(), 5);
  const auto dout = test::randn(d.B * d.T * d.Hq * d.D, 6);
  const Result plain = fast_runner(dev(), DType::F32)(d, qkv, dout, {});
  const Result packed = fast_runner(dev(), DType::F32)(d, qkv, dout, l.flat(d.T));
  EXPECT_EQ(plain.out, packed.out);
  EXPECT_EQ(plain.lse, packed.lse);
  EXPECT_EQ(plain.dqkv, packed.dqkv);
}

// Changing one document's tokens leaves every other document's outputs and
// gradients bit-identical: nothing leaks across a boundary, either way.
TEST_P(AttentionVarlenFast, DocumentsAreIsolated) {
  const AttentionDims d{1, 200, 4, 2, 32};
  const std::vector<int32_t> cu = {0, 70, 130, 200};
  auto qkv = test::randn(d.T * d.row(), 8);
  const auto dout = test::randn(d.T * d.Hq * d.D, 9);
  const Result base = fast_runner(dev(), DType::F32)(d, qkv, dout, cu);
  for (int64_t t = 70; t < 130; ++t)
    for (int64_t c = 0; c < d.row(); ++c) qkv[t * d.row() + c] += 0.75;
  const Result pert = fast_runner(dev(), DType::F32)(d, qkv, dout, cu);
  for (int64_t t = 0; t < d.T; ++t) {
    if (t >= 70 && t < 130) continue;
    for (int64_t c = 0; c < d.Hq * d.D; ++c)
      ASSERT_EQ(pert.out[t * d.Hq * d.D + c], base.out[t * d.Hq * d.D + c]) << "t=" << t;
    for (int64_t c = 0; c < d.row(); ++c)
      ASSERT_EQ(pert.dqkv[t * d.row() + c], base.dqkv[t * d.row() + c]) << "t=" << t;
  }
}

TEST_P(AttentionVarlenFast, RejectsBadBoundaries) {
  const int64_t T = 8;
  Tensor qkv = test::make({2, T, 6 * 8}, DType::F32, std::vector<double>(2 * T * 48),
                          dev());  // Hq=2, Hkv=2, D=8
  Tensor out = Tensor::empty({2, T, 16}, DType::F32, dev());
  Tensor lse = Tensor::empty({2, 2, T}, DType::F32, dev());
  auto cu = [&](std::vector<int32_t> v, int64_t rows) {
    return test::make_i32({rows, int64_t(v.size()) / rows}, v, dev());
  };
  EXPECT_NO_THROW(ops::attention_forward(out, lse, qkv, 2, 2, cu({0, 3, 8, 0, 8, 8}, 2)));
  EXPECT_THROW(ops::attention_forward(out, lse, qkv, 2, 2, cu({1, 3, 8, 0, 8, 8}, 2)), Error);
  EXPECT_THROW(ops::attention_forward(out, lse, qkv, 2, 2, cu({0, 3, 7, 0, 8, 8}, 2)), Error);
  EXPECT_THROW(ops::attention_forward(out, lse, qkv, 2, 2, cu({0, 5, 3, 8, 0, 8, 8, 8}, 2)), Error);
  // Past T before decreasing back to T: rejected before any start is written.
  EXPECT_THROW(ops::attention_forward(out, lse, qkv, 2, 2, cu({0, 9, 8, 0, 8, 8}, 2)), Error);
  EXPECT_THROW(ops::attention_forward(out, lse, qkv, 2, 2, cu({0, 8}, 1)), InternalError);  // B
  EXPECT_THROW(ops::attention_forward(out, lse, qkv, 2, 2, cu({0, 0}, 2)), InternalError);  // S=0
  Tensor f = test::make({2, 2}, DType::F32, std::vector<double>(4), dev());
  EXPECT_THROW(ops::attention_forward(out, lse, qkv, 2, 2, f), InternalError);  // dtype
}

}  // namespace
}  // namespace nk
