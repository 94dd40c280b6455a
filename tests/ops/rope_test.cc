// RoPE (HF rotate-half): table values, reference backward vs finite differences,
// an independent rotate_half formula, the op on every backend vs reference,
// inverse, and that only the rotated columns change.
#include <cmath>
#include <tuple>

#include "ops/op_harness.h"
#include "ops/ops.h"
#include "ops/ref/rope.h"

namespace nk {
namespace {

using namespace test;  // the op harness: make, randn, expect_close, ...
using Vec = std::vector<double>;

NK_COVERS(Rope, TableMatchesDirectFormula, rope_table);
TEST(Rope, TableMatchesDirectFormula) {
  const int64_t T = 300, D = 12;
  const double theta = 10000;
  Vec tab = values(ops::rope_table(T, D, theta));
  for (int64_t t : {0, 1, 7, 299}) {
    for (int64_t i = 0; i < D / 2; ++i) {
      double f = 1.0 / std::pow(theta, double(2 * i) / double(D));
      EXPECT_NEAR(tab[t * D + i], std::cos(t * f), 1e-7) << t << "," << i;
      EXPECT_NEAR(tab[t * D + D / 2 + i], std::sin(t * f), 1e-7) << t << "," << i;
    }
  }
}

TEST(RopeRef, BackwardIsInverseAndMatchesFiniteDifferences) {
  const int64_t B = 2, T = 3, W = 20, H = 2, D = 8;
  Vec table(16 * D);
  ref::rope_table(table.data(), 16, D, 500.0);
  Vec x = randn(B * T * W, 1), dy = randn(B * T * W, 2);
  Vec dx = dy;  // the backward of a rotation is its transpose: the inverse rotation
  ref::rope_inplace(dx.data(), B, T, W, H, D, table.data(), 4, true);
  auto loss = [&](const Vec& v) {
    Vec y = v;
    ref::rope_inplace(y.data(), B, T, W, H, D, table.data(), 4, false);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
    return s;
  };
  check_grad_fd(loss, x, dx, "rope dx");
}

// HF: q * cat(cos, cos) + rotate_half(q) * cat(sin, sin), rotate_half(q) = cat(-q2, q1).
TEST(RopeRef, MatchesHuggingFaceRotateHalf) {
  const int64_t T = 5, W = 3 * 6, H = 3, D = 6, pos0 = 2;
  const double theta = 100;
  Vec x = randn(T * W, 3), y = x;
  Vec table(16 * D);
  ref::rope_table(table.data(), 16, D, theta);
  ref::rope_inplace(y.data(), 1, T, W, H, D, table.data(), pos0, false);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const double* q = &x[t * W + h * D];
      for (int64_t j = 0; j < D; ++j) {
        int64_t i = j % (D / 2);
        double ang = double(pos0 + t) * std::pow(theta, -2.0 * double(i) / double(D));
        double rot = j < D / 2 ? -q[j + D / 2] : q[j - D / 2];
        double want = q[j] * std::cos(ang) + rot * std::sin(ang);
        EXPECT_NEAR(y[t * W + h * D + j], want, 1e-12) << t << "," << h << "," << j;
      }
    }
  }
}

// Partial rotary (HF's partial_rotary_factor, apply_rotary_pos_emb): q_rot =
// q[:R] turned as a head of R (rotate_half over R), q_pass = q[R:] unchanged,
// the frequencies those of a head of R (theta^(-2i/R)).
TEST(RopeRef, PartialRotaryMatchesHuggingFace) {
  const int64_t T = 4, H = 2, D = 10, R = 4, W = H * D + 3, pos0 = 3;
  const double theta = 50;
  Vec x = randn(T * W, 6), y = x;
  Vec table(16 * R);
  ref::rope_table(table.data(), 16, R, theta);
  ref::rope_inplace(y.data(), 1, T, W, H, D, table.data(), pos0, false, R);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const double* q = &x[t * W + h * D];
      for (int64_t j = 0; j < D; ++j) {
        double want = q[j];
        if (j < R) {
          const int64_t i = j % (R / 2);
          const double ang = double(pos0 + t) * std::pow(theta, -2.0 * double(i) / double(R));
          const double rot = j < R / 2 ? -q[j + R / 2] : q[j - R / 2];
          want = q[j] * std::cos(ang) + rot * std::sin(ang);
        }
        EXPECT_NEAR(y[t * W + h * D + j], want, 1e-12) << t << "," << h << "," << j;
      }
    }
    for (int64_t c = H * D; c < W; ++c) EXPECT_EQ(y[t * W + c], x[t * W + c]);
  }
}

TEST(RopeRef, PartialRotaryBackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 3, H = 3, D = 8, R = 4, W = H * D + 2;
  Vec table(16 * R);
  ref::rope_table(table.data(), 16, R, 500.0);
  Vec x = randn(B * T * W, 7), dy = randn(B * T * W, 8);
  Vec dx = dy;
  ref::rope_inplace(dx.data(), B, T, W, H, D, table.data(), 2, true, R);
  auto loss = [&](const Vec& v) {
    Vec y = v;
    ref::rope_inplace(y.data(), B, T, W, H, D, table.data(), 2, false, R);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
    return s;
  };
  check_grad_fd(loss, x, dx, "partial rope dx");
}

class RopeFast : public BackendTest {};
NK_INSTANTIATE_BACKENDS(RopeFast);

void rope_vs_ref(Device dev, DType dt, int64_t B, int64_t T, int64_t W, int64_t H, int64_t D,
                 int64_t pos0, bool inverse) {
  SCOPED_TRACE(testing::Message() << dtype_name(dt) << " B=" << B << " T=" << T << " W=" << W
                                  << " H=" << H << " D=" << D << " inv=" << inverse);
  Tensor table = to_device(ops::rope_table(pos0 + T + 3, D, 10000.0), dev);
  Vec tab = values(table);
  Vec x = rounded(randn(B * T * W, 4), dt), want = x;
  Tensor tx = make({B, T, W}, dt, x, dev);
  ops::rope_inplace(tx, H, D, table, pos0, inverse);
  ref::rope_inplace(want.data(), B, T, W, H, D, tab.data(), pos0, inverse);
  Vec got = values(tx);
  expect_close(got, want, tol_for(dt), "rope");
  // Columns past the rotated heads are untouched, bit for bit.
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t c = H * D; c < W; ++c) ASSERT_EQ(got[r * W + c], x[r * W + c]) << r << "," << c;
}

NK_COVERS(RopeFast, MatchesReference, rope_inplace);
TEST_P(RopeFast, MatchesReference) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (bool inv : {false, true}) {
      rope_vs_ref(dev(), dt, 1, 1, 8, 1, 8, 0, inv);
      rope_vs_ref(dev(), dt, 2, 5, 3 * 10 + 7, 3, 10, 3, inv);  // extra columns (e.g. k, v heads)
      rope_vs_ref(dev(), dt, 2, 33, 4 * 64, 4, 64, 100, inv);
    }
  }
}

// Partial rotary on every backend (each CPU ISA level through ctest's
// test_ops_isa_<level> runs): a table of R < D values, forward and backward
// (inverse), against the double reference; the pass-through values of every
// head and the columns past the heads unchanged bit for bit. Both position
// forms (pos0 + t and explicit ids).
TEST_P(RopeFast, PartialRotaryMatchesReference) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (bool inv : {false, true}) {
      for (auto [H, D, R] :
           {std::tuple<int64_t, int64_t, int64_t>{3, 16, 8}, {2, 12, 6}, {4, 64, 32}, {1, 8, 2}}) {
        SCOPED_TRACE(testing::Message()
                     << dtype_name(dt) << " H=" << H << " D=" << D << " R=" << R << " inv=" << inv);
        const int64_t B = 2, T = 7, W = (H + 2) * D, pos0 = 5;
        Tensor table = to_device(ops::rope_table(pos0 + T + 2, R, 10000.0), dev());
        Vec tab = values(table);
        Vec x = rounded(randn(B * T * W, 9), dt), want = x;
        Tensor tx = make({B, T, W}, dt, x, dev());
        ops::rope_inplace(tx, H, D, table, pos0, inv);
        ref::rope_inplace(want.data(), B, T, W, H, D, tab.data(), pos0, inv, R);
        Vec got = values(tx);
        expect_close(got, want, tol_for(dt), "partial rope");
        for (int64_t r = 0; r < B * T; ++r)
          for (int64_t c = 0; c < W; ++c)
            if (c >= H * D || c % D >= R) {
              ASSERT_EQ(got[r * W + c], x[r * W + c]) << r << "," << c;
            }
        // Explicit positions: each row's ids pos0 + t, as the cached decode passes them.
        std::vector<double> ids;
        for (int64_t b = 0; b < B; ++b)
          for (int64_t t = 0; t < T; ++t) ids.push_back(double(pos0 + t));
        Tensor tp = make({B, T}, DType::I32, ids, dev());
        Tensor tx2 = make({B, T, W}, dt, x, dev());
        ops::rope_inplace(tx2, H, D, table, tp, inv);
        expect_close(values(tx2), got, {0, 0}, "partial rope, position ids");
      }
    }
  }
}

TEST_P(RopeFast, RejectsATableWiderThanTheHeadOrOdd) {
  Tensor x = Tensor::empty({1, 2, 16}, DType::F32, dev());
  EXPECT_THROW(ops::rope_inplace(x, 2, 8, to_device(ops::rope_table(8, 10, 1e4), dev()), 0),
               InternalError);
  Tensor odd = to_device(Tensor::zeros({8, 3}, DType::F32), dev());
  EXPECT_THROW(ops::rope_inplace(x, 2, 8, odd, 0), InternalError);
}

TEST_P(RopeFast, InverseUndoesForward) {
  const int64_t B = 2, T = 9, H = 4, D = 16, W = H * D;
  Tensor table = to_device(ops::rope_table(64, D, 10000.0), dev());
  Vec x = randn(B * T * W, 5);
  Tensor tx = make({B, T, W}, DType::F32, x, dev());
  ops::rope_inplace(tx, H, D, table, 7, false);
  ops::rope_inplace(tx, H, D, table, 7, true);
  expect_close(values(tx), x, {1e-6, 1e-6}, "roundtrip");  // two fp32 rotations
}

TEST_P(RopeFast, RejectsPositionsPastTheTable) {
  Tensor table = to_device(ops::rope_table(8, 4, 10000.0), dev());
  Tensor x = Tensor::empty({1, 6, 8}, DType::F32, dev());
  EXPECT_THROW(ops::rope_inplace(x, 2, 4, table, 3), InternalError);
}

}  // namespace
}  // namespace nk
