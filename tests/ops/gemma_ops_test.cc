// The block features Gemma 2 and 3 need, op by op: GeGLU with the tanh GELU,
// soft-capping (final logits), RMSNorm with a (1 + w) scale, and attention
// with its own score scale (query_pre_attn_scalar) and soft-capped scores
// (attn_logit_softcapping), in the training kernels and over the KV cache.
// Each reference backward against finite differences (double), each CPU
// kernel against the double reference (f32 and bf16 at test::tol_for). The
// CUDA backend has none of them yet (geglu and softcap are CPU-only kernels;
// the others refuse a non-default argument by name), so the fast checks run
// on the CPU.
#include <gtest/gtest.h>

#include <cmath>

#include "op_harness.h"
#include "ops/ops.h"
#include "ops/ref/activation.h"
#include "ops/ref/attention.h"
#include "ops/ref/kv_attention.h"
#include "ops/ref/norm.h"

namespace nk {
namespace {

using namespace test;
using Vec = std::vector<double>;

// ---- GeGLU ----

TEST(GemmaOpsRef, GegluBackwardMatchesFiniteDifferences) {
  const int64_t N = 3, F = 7;
  Vec gu = randn(N * 2 * F, 3, 2.0), dy = randn(N * F, 4), dgu(N * 2 * F);
  ref::geglu_backward(dgu.data(), dy.data(), gu.data(), N, F);
  auto loss = [&](const Vec& v) {
    Vec y(N * F);
    ref::geglu_forward(y.data(), v.data(), N, F);
    return dot(y, dy);
  };
  check_grad_fd(loss, gu, dgu, "geglu dgu");
}

NK_COVERS(GemmaOps, GegluMatchesReference, geglu_forward, geglu_backward);
TEST(GemmaOps, GegluMatchesReference) {
  struct S {
    int64_t N, F;
  };
  for (DType dt : {DType::F32, DType::BF16})
    for (S s : {S{1, 5}, S{3, 17}, S{33, 688}}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " N=" << s.N << " F=" << s.F);
      Vec gu = rounded(randn(s.N * 2 * s.F, 7, 3.0), dt);
      Vec dy = rounded(randn(s.N * s.F, 8), dt);
      Tensor tgu = make({s.N, 2 * s.F}, dt, gu, kHost), ty = Tensor::empty({s.N, s.F}, dt);
      Tensor tdgu = make({s.N, 2 * s.F}, dt, randn(s.N * 2 * s.F, 9), kHost);  // overwritten
      ops::geglu_forward(ty, tgu);
      ops::geglu_backward(tdgu, make({s.N, s.F}, dt, dy, kHost), tgu);
      Vec y(s.N * s.F), dgu(s.N * 2 * s.F);
      ref::geglu_forward(y.data(), gu.data(), s.N, s.F);
      ref::geglu_backward(dgu.data(), dy.data(), gu.data(), s.N, s.F);
      expect_close(values(ty), y, tol_for(dt), "y");
      expect_close(values(tdgu), dgu, tol_for(dt), "dgu");
    }
  Tensor odd = Tensor::empty({2, 7}, DType::F32), y = Tensor::empty({2, 3}, DType::F32);
  EXPECT_THROW(ops::geglu_forward(y, odd), InternalError);
}

// ---- soft-capping ----

TEST(GemmaOpsRef, SoftcapGradientMatchesFiniteDifferences) {
  for (double x : {-300.0, -31.0, -2.5, 0.0, 0.7, 29.0, 250.0}) {
    const double h = 1e-5, cap = 30.0;
    EXPECT_NEAR(ref::softcap_grad(x, cap),
                (ref::softcap(x + h, cap) - ref::softcap(x - h, cap)) / (2 * h), 1e-8)
        << x;
    EXPECT_LT(std::abs(ref::softcap(x, cap)), cap);
  }
}

NK_COVERS(GemmaOps, SoftcapMatchesReference, softcap_forward, softcap_backward);
TEST(GemmaOps, SoftcapMatchesReference) {
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t n : {1, 15, 70001}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " n=" << n);
      const float cap = 5.f;
      Vec x = rounded(randn(n, 5, 8.0), dt), dy = rounded(randn(n, 6), dt);
      Tensor tx = make({n}, dt, x, kHost), ty = Tensor::empty({n}, dt);
      ops::softcap_forward(ty, tx, cap);
      // The backward reads the (rounded) output; the reference the input.
      Tensor tdy = make({n}, dt, dy, kHost);
      ops::softcap_backward(tdy, tdy, ty, cap);  // dx aliases dy
      Vec y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        y[size_t(i)] = ref::softcap(x[size_t(i)], double(cap));
        dx[size_t(i)] = dy[size_t(i)] * ref::softcap_grad(x[size_t(i)], double(cap));
      }
      expect_close(values(ty), y, tol_for(dt), "y");
      // bf16: 1 - (y/c)^2 from a rounded y; its error is y's relative
      // rounding times 2 (y/c)^2, at most ~2^-7 of dy.
      const Tol tol = dt == DType::F32 ? tol_for(dt) : Tol{2e-2, 2e-2};
      expect_close(values(tdy), dx, tol, "dx");
      ops::softcap_forward(tx, tx, cap);  // in place
      expect_close(values(tx), values(ty), {0, 0}, "in place");
    }
  Tensor a = Tensor::empty({4}, DType::F32);
  EXPECT_THROW(ops::softcap_forward(a, a, 0.f), InternalError);
}

// ---- RMSNorm with (1 + w) ----

TEST(GemmaOpsRef, OffsetRmsNormBackwardMatchesFiniteDifferences) {
  const int64_t N = 4, C = 9;
  Vec x = randn(N * C, 20), w = randn(C, 21, 0.2), dy = randn(N * C, 22);
  Vec y(N * C), r(N), dx(N * C), dw(C);
  ref::rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), N, C, 1e-6, 1.0);
  ref::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), r.data(), N, C, 1.0);
  auto loss = [&](const Vec& xx, const Vec& ww) {
    Vec yy(N * C), rr(N);
    ref::rmsnorm_forward(yy.data(), rr.data(), xx.data(), ww.data(), N, C, 1e-6, 1.0);
    return dot(yy, dy);
  };
  check_grad_fd([&](const Vec& v) { return loss(v, w); }, x, dx, "dx");
  check_grad_fd([&](const Vec& v) { return loss(x, v); }, w, dw, "dw");
  // (1 + w) with w = 0 is the plain norm with w = 1.
  Vec ones(C, 1.0), zeros(C, 0.0), a(N * C), b(N * C);
  ref::rmsnorm_forward(a.data(), r.data(), x.data(), ones.data(), N, C, 1e-6);
  ref::rmsnorm_forward(b.data(), r.data(), x.data(), zeros.data(), N, C, 1e-6, 1.0);
  expect_close(a, b, {0, 0}, "1 + 0");
}

TEST(GemmaOps, OffsetRmsNormMatchesReference) {
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t C : {9, 256, 1152}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " C=" << C);
      const int64_t N = 13;
      Vec x = rounded(randn(N * C, 11, 2.0), dt), w = rounded(randn(C, 12, 0.3), dt);
      Vec dy = rounded(randn(N * C, 13), dt), dx0 = rounded(randn(N * C, 14), dt);
      Vec dw0 = randn(C, 15);
      Tensor tx = make({N, C}, dt, x, kHost), tw = make({C}, dt, w, kHost);
      Tensor ty = Tensor::empty({N, C}, dt), tr = Tensor::empty({N}, DType::F32);
      ops::rmsnorm_forward(ty, tr, tx, tw, 1e-6f, 1.f);
      Tensor tdx = make({N, C}, dt, dx0, kHost), tdw = make({C}, DType::F32, dw0, kHost);
      ops::rmsnorm_backward(tdx, tdw, make({N, C}, dt, dy, kHost), tx, tw, tr, 1.f);
      Vec y(N * C), r(N), dx = dx0, dw = dw0;
      ref::rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), N, C, 1e-6, 1.0);
      ref::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), r.data(), N, C,
                            1.0);
      expect_close(values(ty), y, tol_for(dt), "y");
      expect_close(values(tdx), dx, tol_for(dt), "dx");
      expect_close(values(tdw), dw, {1e-4, 1e-4}, "dw");
    }
}

// ---- attention: score scale and soft-capping ----

struct AttnResult {
  Vec out, lse, dqkv;
};

AttnResult ref_attention(const ref::AttentionDims& d, const Vec& qkv, const Vec& dout,
                         int64_t window, double scale, double cap, const AttnResult* fwd) {
  AttnResult r{Vec(size_t(d.B * d.T * d.Hq * d.D)), Vec(size_t(d.B * d.Hq * d.T)), Vec(qkv.size())};
  ref::attention_forward(r.out.data(), r.lse.data(), qkv.data(), d, nullptr, 0, window, scale, cap);
  const AttnResult& f = fwd ? *fwd : r;
  ref::attention_backward(r.dqkv.data(), dout.data(), qkv.data(), f.out.data(), f.lse.data(), d,
                          nullptr, 0, window, scale, cap);
  return r;
}

TEST(GemmaOpsRef, CappedAttentionBackwardMatchesFiniteDifferences) {
  const ref::AttentionDims d{2, 9, 4, 2, 4};
  const Vec qkv = randn(d.B * d.T * d.row(), 21, 3.0);  // large scores: the cap bites
  const Vec dout = randn(d.B * d.T * d.Hq * d.D, 22);
  for (int64_t W : {0, 3})
    for (double cap : {0.0, 1.5}) {
      SCOPED_TRACE(testing::Message() << "window " << W << " cap " << cap);
      const double scale = 0.31;
      const AttnResult r = ref_attention(d, qkv, dout, W, scale, cap, nullptr);
      auto loss = [&](const Vec& x) {
        return dot(ref_attention(d, x, dout, W, scale, cap, nullptr).out, dout);
      };
      check_grad_fd(loss, qkv, r.dqkv, "dqkv", 1e-6, 1e-6, 400);
    }
}

TEST(GemmaOps, ScaledCappedAttentionMatchesReference) {
  struct Case {
    ref::AttentionDims d;
    int64_t window;
  };
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& c :
         {Case{{2, 200, 4, 2, 32}, 0}, Case{{2, 200, 4, 2, 32}, 70}, Case{{1, 130, 8, 2, 64}, 5}}) {
      const ref::AttentionDims& d = c.d;
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " T=" << d.T << " window=" << c.window);
      const Vec qkv = rounded(randn(d.B * d.T * d.row(), 100 + d.T, 2.0), dt);
      const Vec dout = rounded(randn(d.B * d.T * d.Hq * d.D, 200 + d.T), dt);
      const float scale = 1.f / std::sqrt(24.f), cap = 2.f;
      Tensor tq = make({d.B, d.T, d.row()}, dt, qkv, kHost);
      Tensor out = Tensor::empty({d.B, d.T, d.Hq * d.D}, dt);
      Tensor lse = Tensor::empty({d.B, d.Hq, d.T}, DType::F32);
      Tensor dqkv = Tensor::empty({d.B, d.T, d.row()}, dt);
      ops::attention_forward(out, lse, tq, d.Hq, d.Hkv, Tensor(), c.window, scale, cap);
      ops::attention_backward(dqkv, make({d.B, d.T, d.Hq * d.D}, dt, dout, kHost), tq, out, lse,
                              d.Hq, d.Hkv, Tensor(), c.window, scale, cap);
      const AttnResult got{values(out), values(lse), values(dqkv)};
      const AttnResult want = ref_attention(d, qkv, dout, c.window, scale, cap, &got);
      expect_close(got.out, want.out, tol_for(dt), "out");
      expect_close(got.lse, want.lse, tol_for(dt), "lse");
      expect_close(got.dqkv, want.dqkv, tol_for(dt), "dqkv");
    }
}

// The capped, scaled scores over a KV cache (one block per sequence) equal
// the training forward's outputs row by row.
TEST(GemmaOps, CachedCappedAttentionEqualsForward) {
  const ref::AttentionDims d{1, 90, 4, 2, 16};
  const Vec qkv = rounded(randn(d.T * d.row(), 31, 2.0), DType::F32);
  const float scale = 0.2f, cap = 1.5f;
  for (int64_t W : {0, 7}) {
    SCOPED_TRACE(testing::Message() << "window " << W);
    Tensor tq = make({1, d.T, d.row()}, DType::F32, qkv, kHost);
    Tensor out = Tensor::empty({1, d.T, d.Hq * d.D}, DType::F32);
    Tensor lse = Tensor::empty({1, d.Hq, d.T}, DType::F32);
    ops::attention_forward(out, lse, tq, d.Hq, d.Hkv, Tensor(), W, scale, cap);
    Tensor kc = Tensor::empty({1, d.Hkv, d.T, d.D}, DType::F32),
           vc = Tensor::empty({1, d.Hkv, d.T, d.D}, DType::F32);
    std::vector<int32_t> seq(size_t(d.T), 0), pos(size_t(d.T));
    for (int64_t t = 0; t < d.T; ++t) pos[size_t(t)] = int32_t(t);
    Tensor tb = make_i32({1, 1}, {0}, kHost), sq = make_i32({d.T}, seq, kHost),
           ps = make_i32({d.T}, pos, kHost);
    Tensor rows = tq.view({d.T, d.row()}), cached = Tensor::empty({d.T, d.Hq * d.D}, DType::F32);
    ops::kv_cache_store(kc, vc, rows, d.Hq, tb, sq, ps);
    ops::attention_cached(cached, rows, kc, vc, d.Hq, tb, sq, ps, W, scale, cap);
    expect_close(values(cached), values(out), {1e-5, 1e-5}, "cached vs forward");
    // And the double reference of the cache agrees.
    Vec rk(size_t(d.Hkv * d.T * d.D)), rv(rk.size()), want(size_t(d.T * d.Hq * d.D));
    const int32_t table[] = {0};
    const ref::CacheDims c2{d.T, d.Hq, d.Hkv, d.D, d.T, 1, table};
    ref::kv_cache_store(rk.data(), rv.data(), qkv.data(), seq.data(), pos.data(), c2);
    ref::attention_cached(want.data(), qkv.data(), rk.data(), rv.data(), seq.data(), pos.data(), c2,
                          W, double(scale), double(cap));
    expect_close(values(cached), want, tol_for(DType::F32), "cached vs reference");
  }
}

}  // namespace
}  // namespace nk
