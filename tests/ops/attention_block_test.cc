// Ring attention's block op (ops::attention_block_forward/backward, context
// parallelism) on one process with simulated ranks: a sequence cut into
// 2·cp chunks, rank r holding chunks r and 2·cp−1−r (nn/context_parallel.h),
// each rank's queries meeting every rank's key/value block in ring order
// (merged through the log-sum-exp), must give the whole sequence's causal
// attention (ops::attention_forward) at those tokens; the blocks' backward
// shares, the keys' and values' summed over every rank's queries, its
// gradients. GQA, a sliding window, Gemma's scaled and capped scores, packed rows (documents whose
// edges cross the chunks', each query seeing its own document: ops::attention_forward's cu_seqlens
// against the block op's per-query document starts), and chunks shorter and longer than the
// kernel's tiles included. Tolerance: fp32 sums in a different order, 1e-5 relative to each
// tensor's largest value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernel_cases.h"
#include "nn/context_parallel.h"
#include "op_harness.h"
#include "ops/ops.h"

namespace nk {
namespace {

struct Case {
  int64_t cp, Hq, Hkv, window;
  int64_t c = 5;  // tokens per chunk
  bool packed = false;
  float scale = 0.f, softcap = 0.f;  // Gemma's scores: 0 = 1/sqrt(D), uncapped
};

void check_ring(const Case& k) {
  const int64_t B = 2, c = k.c, T = 2 * k.cp * c, D = 8, Tl = 2 * c;
  const int64_t C = (k.Hq + 2 * k.Hkv) * D, OC = k.Hq * D, KC = 2 * k.Hkv * D;
  SCOPED_TRACE(::testing::Message()
               << "cp " << k.cp << " Hq " << k.Hq << " Hkv " << k.Hkv << " window " << k.window
               << " chunk " << k.c << (k.packed ? " packed" : "") << " scale " << k.scale
               << " softcap " << k.softcap);
  Tensor qkv = test::make({B, T, C}, DType::F32, test::randn(size_t(B * T * C), 7));
  Tensor dout = test::make({B, T, OC}, DType::F32, test::randn(size_t(B * T * OC), 8));
  Tensor out = Tensor::empty({B, T, OC}, DType::F32), lse = Tensor::empty({B, k.Hq, T}, DType::F32);
  Tensor dqkv = Tensor::empty({B, T, C}, DType::F32);
  // Packed: row 0 holds documents [0, 3), [3, T/2 + 1), [T/2 + 1, T) (and an
  // empty one at the end), row 1 [0, 1), an empty one, [1, T - 2), [T - 2, T).
  const int64_t S = 4;
  const std::vector<int32_t> starts = {0, 3, int32_t(T / 2 + 1), int32_t(T), int32_t(T), 0,
                                       1, 1, int32_t(T - 2),     int32_t(T)};
  Tensor cu = k.packed ? test::make_i32({B, S + 1}, starts) : Tensor();
  ops::attention_forward(out, lse, qkv, k.Hq, k.Hkv, cu, k.window, k.scale, k.softcap);
  ops::attention_backward(dqkv, dout, qkv, out, lse, k.Hq, k.Hkv, cu, k.window, k.scale, k.softcap);

  // Each simulated rank's tokens: rows of the whole tensors at global positions.
  auto local = [&](const Tensor& whole, int64_t r, int64_t col0, int64_t w) {
    Tensor t = Tensor::empty({B, Tl, w}, DType::F32);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < Tl; ++i) {
        const int64_t g = nn::cp_global_position(i, r, k.cp, c);
        const float* src = whole.data<float>() + (b * T + g) * whole.dim(2) + col0;
        std::copy_n(src, w, t.data<float>() + (b * Tl + i) * w);
      }
    return t;
  };
  std::vector<Tensor> lq, lkv, ldo, pos, lo, ll, dq, dkv, qstart;
  for (int64_t r = 0; r < k.cp; ++r) {
    lq.push_back(local(qkv, r, 0, C));
    lkv.push_back(local(qkv, r, OC, KC));
    ldo.push_back(local(dout, r, 0, OC));
    std::vector<int32_t> p(static_cast<size_t>(Tl));
    for (int64_t i = 0; i < Tl; ++i) p[size_t(i)] = int32_t(nn::cp_global_position(i, r, k.cp, c));
    pos.push_back(test::make_i32({Tl}, p));
    std::vector<int32_t> st;  // each local token's document start
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < Tl; ++i) {
        const int32_t g = p[size_t(i)];
        int32_t s0 = 0;
        for (int64_t d = 0; d < S; ++d) {
          const int32_t lo_d = starts[size_t(b * (S + 1) + d)];
          if (lo_d <= g && g < starts[size_t(b * (S + 1) + d + 1)]) s0 = lo_d;
        }
        st.push_back(s0);
      }
    qstart.push_back(k.packed ? test::make_i32({B, Tl}, st) : Tensor());
    lo.push_back(Tensor::zeros({B, Tl, OC}, DType::F32));
    ll.push_back(Tensor::empty({B, k.Hq, Tl}, DType::F32));
    ops::fill(ll.back(), -INFINITY);
    dq.push_back(Tensor::zeros({B, Tl, OC}, DType::F32));
    dkv.push_back(Tensor::zeros({B, Tl, KC}, DType::F32));
  }
  for (int64_t r = 0; r < k.cp; ++r)
    for (int64_t s = 0; s < k.cp; ++s) {  // ring order: step s brings rank r - s's block
      const int64_t o = (r - s + k.cp) % k.cp;
      ops::attention_block_forward(lo[size_t(r)], ll[size_t(r)], lq[size_t(r)], lkv[size_t(o)],
                                   pos[size_t(r)], pos[size_t(o)], k.Hq, k.Hkv, k.window,
                                   qstart[size_t(r)], k.scale, k.softcap);
    }
  for (int64_t r = 0; r < k.cp; ++r)
    for (int64_t s = 0; s < k.cp; ++s) {
      const int64_t o = (r - s + k.cp) % k.cp;
      ops::attention_block_backward(dq[size_t(r)], dkv[size_t(o)], ldo[size_t(r)], lo[size_t(r)],
                                    ll[size_t(r)], lq[size_t(r)], lkv[size_t(o)], pos[size_t(r)],
                                    pos[size_t(o)], k.Hq, k.Hkv, k.window, qstart[size_t(r)],
                                    k.scale, k.softcap);
    }
  auto scale_of = [](const Tensor& t) {
    double m = 0;
    for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(double(t.data<float>()[i])));
    return m;
  };
  auto expect_rows = [&](const Tensor& got, const Tensor& whole, int64_t r, int64_t col0,
                         const char* what) {
    const Tensor want = local(whole, r, col0, got.dim(2));
    const double tol = 1e-5 * std::max(1.0, scale_of(want));
    for (int64_t i = 0; i < got.numel(); ++i)
      ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], tol)
          << what << " of rank " << r << " at " << i;
  };
  for (int64_t r = 0; r < k.cp; ++r) {
    expect_rows(lo[size_t(r)], out, r, 0, "out");
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < k.Hq; ++h)
        for (int64_t i = 0; i < Tl; ++i) {
          const int64_t g = nn::cp_global_position(i, r, k.cp, c);
          ASSERT_NEAR(ll[size_t(r)].data<float>()[(b * k.Hq + h) * Tl + i],
                      lse.data<float>()[(b * k.Hq + h) * T + g], 1e-5)
              << "lse of rank " << r;
        }
    expect_rows(dq[size_t(r)], dqkv, r, 0, "dq");
    expect_rows(dkv[size_t(r)], dqkv, r, OC, "dk, dv");
  }
}

NK_COVERS(AttentionBlock, RingMatchesWholeSequence, attention_block_forward,
          attention_block_backward);
TEST(AttentionBlock, RingMatchesWholeSequence) {
  for (const Case& k :
       {Case{1, 2, 2, 0}, Case{2, 4, 4, 0}, Case{2, 4, 2, 0}, Case{4, 4, 1, 0}, Case{4, 6, 2, 0},
        Case{2, 4, 2, 7}, Case{4, 4, 2, 3},
        // Chunks longer than the kernel's 64-token tiles: tiles wholly
        // visible, wholly hidden and straddling a chunk's edge.
        Case{2, 4, 2, 0, 80}, Case{2, 2, 1, 100, 80},
        // Packed rows: documents crossing the chunks' edges, with a
        // window, and over tiles (chunks of 80 tokens).
        Case{1, 2, 2, 0, 5, true}, Case{2, 4, 2, 0, 5, true}, Case{4, 4, 1, 0, 5, true},
        Case{2, 4, 2, 7, 5, true}, Case{2, 4, 2, 0, 80, true}, Case{4, 2, 1, 50, 80, true},
        // Gemma's scores: a scale of their own, capped (softcap 1.5 on scores
        // of about unit size: tanh well off its linear part).
        Case{2, 4, 2, 0, 5, false, 0.2f}, Case{2, 4, 2, 0, 5, false, 0.f, 1.5f},
        Case{4, 4, 2, 7, 5, true, 0.3f, 1.5f}, Case{2, 4, 2, 0, 80, false, 0.25f, 2.f}})
    check_ring(k);
}

// A query that sees no key of a block leaves the running result untouched
// (a later chunk's keys under the causal mask).
TEST(AttentionBlock, InvisibleBlockLeavesResult) {
  const int64_t B = 1, T = 4, Hq = 2, Hkv = 1, D = 4, C = (Hq + 2 * Hkv) * D;
  Tensor qkv = test::make({B, T, C}, DType::F32, test::randn(size_t(B * T * C), 3));
  Tensor kv = test::make({B, T, 2 * Hkv * D}, DType::F32, test::randn(size_t(B * T * 2 * D), 4));
  Tensor out = test::make({B, T, Hq * D}, DType::F32, test::randn(size_t(B * T * Hq * D), 5));
  Tensor lse = Tensor::empty({B, Hq, T}, DType::F32);
  ops::fill(lse, 1.5f);
  const std::vector<double> before = test::values(out);
  ops::attention_block_forward(out, lse, qkv, kv, test::make_i32({T}, {0, 1, 2, 3}),
                               test::make_i32({T}, {4, 5, 6, 7}), Hq, Hkv);
  EXPECT_EQ(test::values(out), before);
  for (int64_t i = 0; i < lse.numel(); ++i) EXPECT_EQ(lse.data<float>()[i], 1.5f);
}

}  // namespace
}  // namespace nk
