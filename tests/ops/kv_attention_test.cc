// ops::kv_cache_store + ops::attention_cached against the double reference
// (ops/ref/kv_attention.h), f32 and bf16, on a ragged mix of tokens: several
// slots, prefill runs and single decode tokens, GQA and MHA. Also: the cached
// op over a fully stored sequence equals the causal attention_forward, and bad
// slots/positions are errors naming the token.
//
// Tolerances: tol_for(dtype) of op_harness.h against the reference fed the
// same rounded inputs (f32: accumulation order only, 1e-4 rel; bf16: one
// output rounding, 2e-2).
#include <gtest/gtest.h>

#include "ops/op_harness.h"
#include "ops/ops.h"
#include "ops/ref/kv_attention.h"
#include "test_util.h"

namespace nk {
namespace {

using namespace test;  // the op harness: make, randn, expect_close, ...

struct Case {
  int64_t Hq, Hkv, D, S, L;
  std::vector<int32_t> slots, pos;
};

void check_against_reference(const Case& cs, DType dt) {
  const int64_t N = int64_t(cs.slots.size());
  ref::CacheDims d{N, cs.Hq, cs.Hkv, cs.D, cs.S, cs.L};
  const int64_t cache_n = cs.S * cs.Hkv * cs.L * cs.D;
  // The caches start with random history: every position a token attends to
  // but does not store itself is "previously cached".
  std::vector<double> qkv = rounded(randn(size_t(N * d.row()), 1), dt);
  std::vector<double> kc = rounded(randn(size_t(cache_n), 2), dt);
  std::vector<double> vc = rounded(randn(size_t(cache_n), 3), dt);
  Tensor tq = make({N, d.row()}, dt, qkv), tk = make({cs.S, cs.Hkv, cs.L, cs.D}, dt, kc),
         tv = make({cs.S, cs.Hkv, cs.L, cs.D}, dt, vc);
  Tensor sl = Tensor::empty({N}, DType::I32), ps = Tensor::empty({N}, DType::I32);
  std::copy(cs.slots.begin(), cs.slots.end(), sl.data<int32_t>());
  std::copy(cs.pos.begin(), cs.pos.end(), ps.data<int32_t>());
  Tensor out = Tensor::empty({N, cs.Hq * cs.D}, dt);
  ops::kv_cache_store(tk, tv, tq, cs.Hq, sl, ps);
  ops::attention_cached(out, tq, tk, tv, cs.Hq, sl, ps);

  std::vector<double> want(size_t(N * cs.Hq * cs.D));
  ref::kv_cache_store(kc.data(), vc.data(), qkv.data(), cs.slots.data(), cs.pos.data(), d);
  ref::attention_cached(want.data(), qkv.data(), kc.data(), vc.data(), cs.slots.data(),
                        cs.pos.data(), d);
  expect_close(values(tk), kc, {0, 0}, "k_cache");
  expect_close(values(tv), vc, {0, 0}, "v_cache");
  expect_close(values(out), want, tol_for(dt), "out");
}

// Slot 0: a 70-token prefill (crosses a 64 boundary); slot 2: decode at 37;
// slot 1: a 5-token prefill continuing at position 10; slot 3: position 0.
Case ragged(int64_t Hq, int64_t Hkv, int64_t D) {
  Case c{Hq, Hkv, D, 4, 96, {}, {}};
  for (int32_t p = 0; p < 70; ++p) c.slots.push_back(0), c.pos.push_back(p);
  c.slots.push_back(2), c.pos.push_back(37);
  for (int32_t p = 10; p < 15; ++p) c.slots.push_back(1), c.pos.push_back(p);
  c.slots.push_back(3), c.pos.push_back(0);
  return c;
}

TEST(KvAttention, MatchesReferenceF32) {
  check_against_reference(ragged(4, 2, 16), DType::F32);
  check_against_reference(ragged(3, 3, 24), DType::F32);
  check_against_reference(ragged(8, 1, 64), DType::F32);
}

TEST(KvAttention, MatchesReferenceBf16) {
  check_against_reference(ragged(4, 2, 16), DType::BF16);
  check_against_reference(ragged(8, 1, 64), DType::BF16);
}

// Storing a whole sequence at positions 0..T-1 then attending is causal
// attention: compare with attention_forward on the same qkv (f32).
TEST(KvAttention, FullSequenceEqualsCausalAttention) {
  const int64_t T = 77, Hq = 4, Hkv = 2, D = 16, W = (Hq + 2 * Hkv) * D;
  Tensor qkv = make({1, T, W}, DType::F32, randn(size_t(T * W), 5));
  Tensor out = Tensor::empty({1, T, Hq * D}, DType::F32),
         lse = Tensor::empty({1, Hq, T}, DType::F32);
  ops::attention_forward(out, lse, qkv, Hq, Hkv);
  Tensor kc = Tensor::zeros({2, Hkv, T, D}, DType::F32),
         vc = Tensor::zeros({2, Hkv, T, D}, DType::F32);
  Tensor sl = Tensor::empty({T}, DType::I32), ps = Tensor::empty({T}, DType::I32);
  for (int64_t t = 0; t < T; ++t) sl.data<int32_t>()[t] = 1, ps.data<int32_t>()[t] = int32_t(t);
  Tensor got = Tensor::empty({T, Hq * D}, DType::F32);
  Tensor q2 = qkv.view({T, W});
  ops::kv_cache_store(kc, vc, q2, Hq, sl, ps);
  ops::attention_cached(got, q2, kc, vc, Hq, sl, ps);
  expect_close(values(got), values(out), {1e-5, 1e-6}, "cached vs causal");
}

TEST(KvAttention, BadSlotOrPositionNamesTheToken) {
  Tensor qkv = Tensor::zeros({2, 4 * 8}, DType::F32);
  Tensor kc = Tensor::zeros({2, 1, 8, 8}, DType::F32), vc = Tensor::zeros({2, 1, 8, 8}, DType::F32);
  Tensor sl = Tensor::zeros({2}, DType::I32), ps = Tensor::zeros({2}, DType::I32);
  Tensor out = Tensor::empty({2, 2 * 8}, DType::F32);
  sl.data<int32_t>()[1] = 2;
  EXPECT_TRUE(
      test::contains(test::error_of([&] { ops::attention_cached(out, qkv, kc, vc, 2, sl, ps); }),
                     "token 1 names cache slot 2"));
  sl.data<int32_t>()[1] = 0;
  ps.data<int32_t>()[0] = 8;
  EXPECT_TRUE(test::contains(test::error_of([&] { ops::kv_cache_store(kc, vc, qkv, 2, sl, ps); }),
                             "token 0 is at position 8"));
}

}  // namespace
}  // namespace nk
