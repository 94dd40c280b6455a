// Attention: reference backward vs finite differences, the op on every
// backend vs the double reference (f32, bf16; ragged tiles, GQA groups, D =
// 64/32/20), causality and determinism.
#include <gtest/gtest.h>

#include "op_harness.h"
#include "ops/ops.h"
#include "ops/ref/attention.h"

namespace nk {
namespace {

using ref::AttentionDims;
using test::values;

struct RefOut {
  std::vector<double> out, lse;
};

RefOut ref_forward(const AttentionDims& d, const std::vector<double>& qkv) {
  RefOut r{std::vector<double>(d.B * d.T * d.Hq * d.D), std::vector<double>(d.B * d.Hq * d.T)};
  ref::attention_forward(r.out.data(), r.lse.data(), qkv.data(), d);
  return r;
}

std::vector<double> ref_backward(const AttentionDims& d, const std::vector<double>& dout,
                                 const std::vector<double>& qkv, const std::vector<double>& out,
                                 const std::vector<double>& lse) {
  std::vector<double> dqkv(qkv.size());
  ref::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), d);
  return dqkv;
}

// The elements of qkv that belong to part 0 (q), 1 (k) or 2 (v).
std::vector<size_t> part_indices(const AttentionDims& d, int part) {
  const int64_t lo[3] = {0, d.Hq * d.D, (d.Hq + d.Hkv) * d.D};
  const int64_t hi[3] = {d.Hq * d.D, (d.Hq + d.Hkv) * d.D, d.row()};
  std::vector<size_t> idx;
  for (int64_t i = 0; i < d.B * d.T * d.row(); ++i) {
    const int64_t c = i % d.row();
    if (c >= lo[part] && c < hi[part]) idx.push_back(size_t(i));
  }
  return idx;
}

TEST(AttentionRef, BackwardMatchesFiniteDifferences) {
  for (int64_t T : {5, 7, 9}) {
    const AttentionDims d{2, T, 4, 2, 4};
    const auto qkv = test::randn(d.B * d.T * d.row(), 11 + T);
    const auto dout = test::randn(d.B * d.T * d.Hq * d.D, 12 + T);
    const RefOut f = ref_forward(d, qkv);
    const auto grad = ref_backward(d, dout, qkv, f.out, f.lse);
    for (int part = 0; part < 3; ++part) {
      const auto idx = part_indices(d, part);
      std::vector<double> x(idx.size()), g(idx.size());
      for (size_t i = 0; i < idx.size(); ++i) x[i] = qkv[idx[i]], g[i] = grad[idx[i]];
      auto loss = [&](const std::vector<double>& xs) {
        auto full = qkv;
        for (size_t i = 0; i < idx.size(); ++i) full[idx[i]] = xs[i];
        const auto out = ref_forward(d, full).out;
        double s = 0;
        for (size_t i = 0; i < out.size(); ++i) s += out[i] * dout[i];
        return s;
      };
      const char* names[3] = {"dq", "dk", "dv"};
      test::check_grad_fd(loss, x, g, names[part], 1e-6, 1e-6, 200);
    }
  }
}

struct Case {
  int64_t B, T, Hq, Hkv, D;
};

class AttentionFast : public test::BackendTest {};
NK_INSTANTIATE_BACKENDS(AttentionFast);

// Fast forward and backward against the double reference fed the same rounded
// inputs (and, for the backward, the fast forward's own out and lse).
void check_fast(Device dev, const Case& c, DType dt) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " B=" << c.B << " T=" << c.T
                                    << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " D=" << c.D);
  const AttentionDims d{c.B, c.T, c.Hq, c.Hkv, c.D};
  const auto qkv = test::rounded(test::randn(d.B * d.T * d.row(), 100 + c.T + c.D), dt);
  const auto dout = test::rounded(test::randn(d.B * d.T * d.Hq * d.D, 200 + c.T), dt);
  Tensor tq = test::make({d.B, d.T, d.row()}, dt, qkv, dev);
  Tensor out = Tensor::empty({d.B, d.T, d.Hq * d.D}, dt, dev);
  Tensor lse = Tensor::empty({d.B, d.Hq, d.T}, DType::F32, dev);
  ops::attention_forward(out, lse, tq, d.Hq, d.Hkv);
  const RefOut want = ref_forward(d, qkv);
  const auto tol = test::tol_for(dt);
  test::expect_close(values(out), want.out, tol, "out");
  test::expect_close(values(lse), want.lse, tol, "lse");

  Tensor tdo = test::make({d.B, d.T, d.Hq * d.D}, dt, dout, dev);
  Tensor dqkv = Tensor::empty({d.B, d.T, d.row()}, dt, dev);
  ops::attention_backward(dqkv, tdo, tq, out, lse, d.Hq, d.Hkv);
  const auto want_d = ref_backward(d, dout, qkv, values(out), values(lse));
  test::expect_close(values(dqkv), want_d, tol, "dqkv");
}

const Case kCases[] = {
    {1, 1, 4, 4, 64},    // single token
    {2, 7, 4, 2, 32},    // less than one tile, group 2
    {1, 65, 4, 1, 64},   // one row past a tile, group 4
    {2, 130, 2, 2, 32},  // three tiles, MHA
    {1, 130, 8, 2, 64},  // group 4, ragged last tile
    {1, 128, 2, 1, 64},  // exact tiles
    {1, 70, 3, 1, 20},   // D not a multiple of the vector width, group 3
};

NK_COVERS(AttentionFast, MatchesReferenceF32, attention_forward, attention_backward);
TEST_P(AttentionFast, MatchesReferenceF32) {
  for (const Case& c : kCases) check_fast(dev(), c, DType::F32);
}

TEST_P(AttentionFast, MatchesReferenceBF16) {
  for (const Case& c : kCases) check_fast(dev(), c, DType::BF16);
}

// Changing token t's keys and values leaves every earlier output bit-identical.
TEST_P(AttentionFast, Causal) {
  const AttentionDims d{2, 150, 4, 2, 32};
  auto qkv = test::randn(d.B * d.T * d.row(), 7);
  auto run = [&](const std::vector<double>& x) {
    Tensor out = Tensor::empty({d.B, d.T, d.Hq * d.D}, DType::F32, dev());
    Tensor lse = Tensor::empty({d.B, d.Hq, d.T}, DType::F32, dev());
    ops::attention_forward(out, lse, test::make({d.B, d.T, d.row()}, DType::F32, x, dev()), d.Hq,
                           d.Hkv);
    return std::make_pair(values(out), values(lse));
  };
  const auto base = run(qkv);
  for (int64_t t : {0, 40, 64, 149}) {
    auto x = qkv;
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t c = d.Hq * d.D; c < d.row(); ++c) x[(b * d.T + t) * d.row() + c] += 1.5;
    const auto pert = run(x);
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t s = 0; s < t; ++s)
        for (int64_t c = 0; c < d.Hq * d.D; ++c) {
          const size_t i = (b * d.T + s) * d.Hq * d.D + c;
          ASSERT_EQ(pert.first[i], base.first[i]) << "t=" << t << " s=" << s;
        }
      for (int64_t h = 0; h < d.Hq; ++h)
        for (int64_t s = 0; s < t; ++s)
          ASSERT_EQ(pert.second[(b * d.Hq + h) * d.T + s], base.second[(b * d.Hq + h) * d.T + s]);
      bool changed = false;
      for (int64_t c = 0; c < d.Hq * d.D; ++c)
        changed |= pert.first[(b * d.T + t) * d.Hq * d.D + c] !=
                   base.first[(b * d.T + t) * d.Hq * d.D + c];
      EXPECT_TRUE(changed || t == 0) << "token " << t << " does not see itself";
    }
  }
}

TEST_P(AttentionFast, BackwardIsDeterministic) {
  const AttentionDims d{2, 100, 4, 1, 32};
  Tensor q =
      test::make({d.B, d.T, d.row()}, DType::F32, test::randn(d.B * d.T * d.row(), 3), dev());
  Tensor dout =
      test::make({d.B, d.T, d.Hq * d.D}, DType::F32, test::randn(d.B * d.T * d.Hq * d.D, 4), dev());
  Tensor out = Tensor::empty({d.B, d.T, d.Hq * d.D}, DType::F32, dev());
  Tensor lse = Tensor::empty({d.B, d.Hq, d.T}, DType::F32, dev());
  ops::attention_forward(out, lse, q, d.Hq, d.Hkv);
  Tensor g1 = Tensor::empty(q.shape(), DType::F32, dev()),
         g2 = Tensor::empty(q.shape(), DType::F32, dev());
  ops::attention_backward(g1, dout, q, out, lse, d.Hq, d.Hkv);
  ops::attention_backward(g2, dout, q, out, lse, d.Hq, d.Hkv);
  EXPECT_EQ(values(g1), values(g2));
}

TEST_P(AttentionFast, RejectsBadShapes) {
  Tensor qkv = test::make({1, 4, 6 * 8}, DType::F32, std::vector<double>(4 * 48),
                          dev());  // Hq=2, Hkv=2, D=8
  Tensor out = Tensor::empty({1, 4, 16}, DType::F32, dev());
  Tensor lse = Tensor::empty({1, 2, 4}, DType::F32, dev());
  EXPECT_NO_THROW(ops::attention_forward(out, lse, qkv, 2, 2));
  EXPECT_THROW(ops::attention_forward(out, lse, qkv, 3, 2), InternalError);  // Hq % Hkv
  EXPECT_THROW(ops::attention_forward(out, lse, qkv, 4, 2), InternalError);  // width
  Tensor bad_lse = Tensor::empty({1, 2, 4}, DType::BF16, dev());
  EXPECT_THROW(ops::attention_forward(out, bad_lse, qkv, 2, 2), InternalError);
  Tensor bad_out = Tensor::empty({1, 4, 16}, DType::BF16, dev());
  EXPECT_THROW(ops::attention_forward(bad_out, lse, qkv, 2, 2), InternalError);
  EXPECT_THROW(ops::attention_forward(out, lse, qkv, 2, 2, Tensor(), -1), InternalError);
}

}  // namespace
}  // namespace nk
