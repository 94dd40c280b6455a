// Sliding-window attention (window > 0: token t sees keys t - window < s <= t).
// Reference: its definition (the last token equals plain causal attention over
// its window alone), backward vs finite differences, cached vs full. The op on
// every backend vs the double reference for windows of 1, inside one tile, not
// a multiple of the tile, and >= T, with GQA and packed rows; keys outside the
// window leave outputs bit-identical; window >= T is bit-identical to 0; and
// attention_cached with a window (prefill, then token-by-token decode) equals
// attention_forward with it.
//
// Tolerances: fast vs reference as in attention_test.cc (test::tol_for: fp32
// accumulation order; bf16 one output rounding). Cached vs forward: two fp32
// kernels summing in different orders, 1e-5 relative to the tensor's scale as
// in kv_attention_test.cc. The double reference against itself: 1e-12.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/rng.h"
#include "op_harness.h"
#include "ops/ops.h"
#include "ops/ref/attention.h"
#include "ops/ref/kv_attention.h"

namespace nk {
namespace {

using ref::AttentionDims;
using test::values;

struct Result {
  std::vector<double> out, lse, dqkv;
};

// Reference forward; backward from the given out and lse (the fast path's own
// when comparing with it). cu: per-row cumulative starts, empty for none.
Result ref_run(const AttentionDims& d, const std::vector<double>& qkv,
               const std::vector<double>& dout, const std::vector<int32_t>& cu, int64_t window,
               const Result* fwd = nullptr) {
  Result r{std::vector<double>(d.B * d.T * d.Hq * d.D), std::vector<double>(d.B * d.Hq * d.T),
           std::vector<double>(qkv.size())};
  const int32_t* c = cu.empty() ? nullptr : cu.data();
  const int64_t n_cu = int64_t(cu.size()) / d.B;
  ref::attention_forward(r.out.data(), r.lse.data(), qkv.data(), d, c, n_cu, window);
  const Result& f = fwd ? *fwd : r;
  ref::attention_backward(r.dqkv.data(), dout.data(), qkv.data(), f.out.data(), f.lse.data(), d, c,
                          n_cu, window);
  return r;
}

Result fast_run(Device dev, DType dt, const AttentionDims& d, const std::vector<double>& qkv,
                const std::vector<double>& dout, const std::vector<int32_t>& cu, int64_t window) {
  Tensor tq = test::make({d.B, d.T, d.row()}, dt, qkv, dev);
  Tensor tdo = test::make({d.B, d.T, d.Hq * d.D}, dt, dout, dev);
  Tensor out = Tensor::empty({d.B, d.T, d.Hq * d.D}, dt, dev);
  Tensor lse = Tensor::empty({d.B, d.Hq, d.T}, DType::F32, dev);
  Tensor dqkv = Tensor::empty({d.B, d.T, d.row()}, dt, dev);
  Tensor tc = cu.empty() ? Tensor() : test::make_i32({d.B, int64_t(cu.size()) / d.B}, cu, dev);
  ops::attention_forward(out, lse, tq, d.Hq, d.Hkv, tc, window);
  ops::attention_backward(dqkv, tdo, tq, out, lse, d.Hq, d.Hkv, tc, window);
  return Result{values(out), values(lse), values(dqkv)};
}

// ---- the reference ----

// The last token with window W sees exactly the last W tokens: its output is
// plain causal attention's last output over those tokens alone.
TEST(AttentionWindowRef, EqualsCausalAttentionOverTheLastWindowTokens) {
  const AttentionDims d{1, 12, 4, 2, 8};
  const auto qkv = test::randn(d.T * d.row(), 1);
  const auto dout = test::randn(d.T * d.Hq * d.D, 2);
  for (int64_t W : {1, 2, 5, 11}) {
    SCOPED_TRACE(::testing::Message() << "window " << W);
    const Result win = ref_run(d, qkv, dout, {}, W);
    const AttentionDims a{1, W, d.Hq, d.Hkv, d.D};
    const std::vector<double> tail(qkv.end() - W * d.row(), qkv.end());
    const Result alone = ref_run(a, tail, std::vector<double>(W * d.Hq * d.D), {}, 0);
    const int64_t O = d.Hq * d.D;
    test::expect_close({win.out.end() - O, win.out.end()}, {alone.out.end() - O, alone.out.end()},
                       {1e-12, 1e-12}, "last output");
  }
}

TEST(AttentionWindowRef, BackwardMatchesFiniteDifferences) {
  const AttentionDims d{2, 9, 4, 2, 4};
  const std::vector<int32_t> packed = {0, 1, 4, 9, 0, 5, 5, 9};  // two rows of 3 documents
  const auto qkv = test::randn(d.B * d.T * d.row(), 21);
  const auto dout = test::randn(d.B * d.T * d.Hq * d.D, 22);
  for (const auto& cu : {std::vector<int32_t>{}, packed})
    for (int64_t W : {1, 2, 4}) {
      SCOPED_TRACE(::testing::Message() << "window " << W << " packed " << !cu.empty());
      const Result r = ref_run(d, qkv, dout, cu, W);
      auto loss = [&](const std::vector<double>& x) {
        return test::dot(ref_run(d, x, dout, cu, W).out, dout);
      };
      test::check_grad_fd(loss, qkv, r.dqkv, "dqkv", 1e-6, 1e-6, 400);
    }
}

// The cached reference with a window over a stored sequence is the windowed
// forward, row by row.
TEST(AttentionWindowRef, CachedEqualsForward) {
  const AttentionDims d{1, 20, 4, 2, 8};
  const auto qkv = test::randn(d.T * d.row(), 31);
  const int32_t table[] = {0};  // one block of T positions
  const ref::CacheDims c{d.T, d.Hq, d.Hkv, d.D, d.T, 1, table};
  std::vector<double> kc(d.Hkv * d.T * d.D), vc(kc.size()), got(d.T * d.Hq * d.D);
  std::vector<int32_t> slot(d.T, 0), pos(d.T);
  for (int64_t t = 0; t < d.T; ++t) pos[t] = int32_t(t);
  ref::kv_cache_store(kc.data(), vc.data(), qkv.data(), slot.data(), pos.data(), c);
  for (int64_t W : {1, 3, 19, 20, 40}) {
    ref::attention_cached(got.data(), qkv.data(), kc.data(), vc.data(), slot.data(), pos.data(), c,
                          W);
    test::expect_close(got, ref_run(d, qkv, std::vector<double>(got.size()), {}, W).out,
                       {1e-12, 1e-12}, "cached vs forward");
  }
}

// ---- the op on every backend ----

class AttentionWindowFast : public test::BackendTest {};
NK_INSTANTIATE_BACKENDS(AttentionWindowFast);

struct Case {
  AttentionDims d;
  std::vector<int32_t> cu;  // per-row cumulative starts, empty for one document per row
  const char* what;
};

std::vector<Case> cases() {
  std::vector<Case> v = {
      {{2, 200, 4, 2, 32}, {}, "GQA group 2"},
      {{1, 130, 8, 2, 64}, {}, "group 4, ragged last tile"},
      {{1, 70, 3, 1, 20}, {}, "group 3, D=20"},
      {{2, 200, 4, 2, 32}, {0, 3, 90, 91, 200, 0, 64, 128, 192, 200}, "packed rows"},
  };
  // Random packed layouts: 1..6 documents per row at random cuts.
  for (uint64_t seed = 0; seed < 2; ++seed) {
    Rng r(seed + 7);
    std::vector<int32_t> cu;
    for (int b = 0; b < 2; ++b) {
      std::vector<int32_t> cuts = {0, 300};
      while (cuts.size() < 7) cuts.push_back(int32_t(1 + r.below(299)));
      std::sort(cuts.begin(), cuts.end());
      cu.insert(cu.end(), cuts.begin(), cuts.end());
    }
    v.push_back({{2, 300, 4, 2, 32}, cu, "random packed rows"});
  }
  return v;
}

// 1; inside one tile; one tile; not a multiple of the tile; near and past T.
std::vector<int64_t> windows(int64_t T) {
  return {1, 5, 64, 70, 130, T - 1, T, T + 37};
}

void check_fast(Device dev, DType dt) {
  for (const Case& c : cases())
    for (int64_t W : windows(c.d.T)) {
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(dt) << " " << c.what << " T=" << c.d.T << " window=" << W);
      const AttentionDims& d = c.d;
      const auto qkv = test::rounded(test::randn(d.B * d.T * d.row(), 100 + d.T + W), dt);
      const auto dout = test::rounded(test::randn(d.B * d.T * d.Hq * d.D, 200 + W), dt);
      const Result got = fast_run(dev, dt, d, qkv, dout, c.cu, W);
      const Result want = ref_run(d, qkv, dout, c.cu, W, &got);
      const auto tol = test::tol_for(dt);
      test::expect_close(got.out, want.out, tol, "out");
      test::expect_close(got.lse, want.lse, tol, "lse");
      test::expect_close(got.dqkv, want.dqkv, tol, "dqkv");
    }
}

NK_COVERS(AttentionWindowFast, MatchesReferenceF32, attention_forward, attention_backward);
TEST_P(AttentionWindowFast, MatchesReferenceF32) {
  check_fast(dev(), DType::F32);
}

TEST_P(AttentionWindowFast, MatchesReferenceBF16) {
  check_fast(dev(), DType::BF16);
}

// Changing token t's keys and values leaves the outputs of every query that
// cannot see it (s < t, or s >= t + window) bit-identical, and changes the
// last query that sees it (t + window - 1).
TEST_P(AttentionWindowFast, KeysOutsideTheWindowDoNotMatter) {
  const AttentionDims d{1, 260, 4, 2, 32};
  const int64_t O = d.Hq * d.D;
  const auto qkv = test::randn(d.T * d.row(), 9);
  const auto dout = test::randn(d.T * O, 10);
  for (int64_t W : {1, 5, 70}) {
    const Result base = fast_run(dev(), DType::F32, d, qkv, dout, {}, W);
    for (int64_t t : {0, 63, 64, 100}) {
      SCOPED_TRACE(::testing::Message() << "window " << W << " token " << t);
      auto x = qkv;
      for (int64_t c = d.Hq * d.D; c < d.row(); ++c) x[t * d.row() + c] += 1.5;
      const Result pert = fast_run(dev(), DType::F32, d, x, dout, {}, W);
      for (int64_t s = 0; s < d.T; ++s) {
        if (s >= t && s < t + W) continue;
        for (int64_t c = 0; c < O; ++c)
          ASSERT_EQ(pert.out[s * O + c], base.out[s * O + c]) << "query " << s;
        for (int64_t h = 0; h < d.Hq; ++h)
          ASSERT_EQ(pert.lse[h * d.T + s], base.lse[h * d.T + s]) << "query " << s;
      }
      const int64_t last = t + W - 1;
      bool changed = false;
      for (int64_t c = 0; c < O; ++c) changed |= pert.out[last * O + c] != base.out[last * O + c];
      EXPECT_TRUE(changed) << "query " << last << " does not see key " << t;
    }
  }
}

// A window reaching back past the row's start is full causal attention, bit
// for bit, with and without packed rows.
TEST_P(AttentionWindowFast, WindowOfAtLeastTIsFullCausal) {
  const AttentionDims d{2, 150, 4, 2, 32};
  const auto qkv = test::randn(d.B * d.T * d.row(), 5);
  const auto dout = test::randn(d.B * d.T * d.Hq * d.D, 6);
  for (const auto& cu : {std::vector<int32_t>{}, std::vector<int32_t>{0, 40, 150, 0, 150, 150}}) {
    const Result full = fast_run(dev(), DType::F32, d, qkv, dout, cu, 0);
    for (int64_t W : {d.T, d.T + 1, int64_t(1) << 20}) {
      SCOPED_TRACE(::testing::Message() << "window " << W << " packed " << !cu.empty());
      const Result win = fast_run(dev(), DType::F32, d, qkv, dout, cu, W);
      EXPECT_EQ(win.out, full.out);
      EXPECT_EQ(win.lse, full.lse);
      EXPECT_EQ(win.dqkv, full.dqkv);
    }
  }
}

// Generation with a window: prefill the first P tokens in one call, then
// decode the rest one by one (store, then attend); every row equals the
// windowed attention_forward over the whole sequence.
TEST_P(AttentionWindowFast, CachedPrefillAndDecodeEqualForward) {
  const int64_t T = 90, P = 40, Hq = 4, Hkv = 2, D = 16, Wd = (Hq + 2 * Hkv) * D;
  const auto x = test::randn(size_t(T * Wd), 11);
  Tensor qkv = test::make({1, T, Wd}, DType::F32, x, dev());
  for (int64_t W : {1, 7, 64, 70, 100}) {
    SCOPED_TRACE(::testing::Message() << "window " << W);
    Tensor out = Tensor::empty({1, T, Hq * D}, DType::F32, dev());
    Tensor lse = Tensor::empty({1, Hq, T}, DType::F32, dev());
    ops::attention_forward(out, lse, qkv, Hq, Hkv, Tensor(), W);
    const auto want = values(out);
    const size_t cache_n = size_t(2 * Hkv * T * D);
    // The cache starts with garbage: positions outside the window are never read.
    Tensor kc = test::make({2, Hkv, T, D}, DType::F32, test::randn(cache_n, 12, 1e3), dev());
    Tensor vc = test::make({2, Hkv, T, D}, DType::F32, test::randn(cache_n, 13, 1e3), dev());
    std::vector<double> got;
    for (int64_t t0 = 0; t0 < T; t0 = t0 == 0 ? P : t0 + 1) {
      const int64_t n = t0 == 0 ? P : 1;
      std::vector<int32_t> pos(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(t0 + i);
      Tensor sl = test::make_i32({n}, std::vector<int32_t>(size_t(n), 1), dev());
      Tensor ps = test::make_i32({n}, pos, dev());
      Tensor q =
          test::make({n, Wd}, DType::F32,
                     std::vector<double>(x.begin() + t0 * Wd, x.begin() + (t0 + n) * Wd), dev());
      Tensor o = Tensor::empty({n, Hq * D}, DType::F32, dev());
      Tensor tb = test::make_i32({2, 1}, {0, 1}, dev());  // contiguous: block s is slot s
      ops::kv_cache_store(kc, vc, q, Hq, tb, sl, ps);
      ops::attention_cached(o, q, kc, vc, Hq, tb, sl, ps, W);
      const auto v = values(o);
      got.insert(got.end(), v.begin(), v.end());
    }
    test::expect_close(got, want, {1e-5, 1e-6}, "cached vs forward");
  }
}

}  // namespace
}  // namespace nk
