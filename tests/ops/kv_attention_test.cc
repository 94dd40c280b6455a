// ops::kv_cache_store + ops::attention_cached on every backend against the
// double reference (ops/ref/kv_attention.h), f32 and bf16, on a ragged mix of tokens: several
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

class KvAttention : public BackendTest {};
NK_INSTANTIATE_BACKENDS(KvAttention);

void check_against_reference(Device dev, const Case& cs, DType dt, int64_t window = 0) {
  const int64_t N = int64_t(cs.slots.size());
  ref::CacheDims d{N, cs.Hq, cs.Hkv, cs.D, cs.S, cs.L};
  const int64_t cache_n = cs.S * cs.Hkv * cs.L * cs.D;
  // The caches start with random history: every position a token attends to
  // but does not store itself is "previously cached".
  std::vector<double> qkv = rounded(randn(size_t(N * d.row()), 1), dt);
  std::vector<double> kc = rounded(randn(size_t(cache_n), 2), dt);
  std::vector<double> vc = rounded(randn(size_t(cache_n), 3), dt);
  Tensor tq = make({N, d.row()}, dt, qkv, dev), tk = make({cs.S, cs.Hkv, cs.L, cs.D}, dt, kc, dev),
         tv = make({cs.S, cs.Hkv, cs.L, cs.D}, dt, vc, dev);
  Tensor sl = make_i32({N}, cs.slots, dev), ps = make_i32({N}, cs.pos, dev);
  Tensor out = Tensor::empty({N, cs.Hq * cs.D}, dt, dev);
  ops::kv_cache_store(tk, tv, tq, cs.Hq, sl, ps);
  ops::attention_cached(out, tq, tk, tv, cs.Hq, sl, ps, window);

  std::vector<double> want(size_t(N * cs.Hq * cs.D));
  ref::kv_cache_store(kc.data(), vc.data(), qkv.data(), cs.slots.data(), cs.pos.data(), d);
  ref::attention_cached(want.data(), qkv.data(), kc.data(), vc.data(), cs.slots.data(),
                        cs.pos.data(), d, window);
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

TEST_P(KvAttention, MatchesReferenceF32) {
  check_against_reference(dev(), ragged(4, 2, 16), DType::F32);
  check_against_reference(dev(), ragged(3, 3, 24), DType::F32);
  check_against_reference(dev(), ragged(8, 1, 64), DType::F32);
}

TEST_P(KvAttention, MatchesReferenceBf16) {
  check_against_reference(dev(), ragged(4, 2, 16), DType::BF16);
  check_against_reference(dev(), ragged(8, 1, 64), DType::BF16);
}

// Sliding windows: 1, shorter than the prefill run, longer than every position.
TEST_P(KvAttention, MatchesReferenceWithWindow) {
  for (int64_t window : {1, 9, 40, 200}) {
    SCOPED_TRACE(::testing::Message() << "window " << window);
    check_against_reference(dev(), ragged(4, 2, 16), DType::F32, window);
    check_against_reference(dev(), ragged(8, 1, 64), DType::BF16, window);
  }
  Tensor qkv = make({1, 4 * 8}, DType::F32, std::vector<double>(32), dev());
  Tensor kc = make({1, 1, 8, 8}, DType::F32, std::vector<double>(64), dev());
  Tensor out = Tensor::empty({1, 2 * 8}, DType::F32, dev());
  Tensor sl = make_i32({1}, {0}, dev()), ps = make_i32({1}, {0}, dev());
  EXPECT_THROW(ops::attention_cached(out, qkv, kc, kc, 2, sl, ps, -1), InternalError);
}

// Storing a whole sequence at positions 0..T-1 then attending is causal
// attention: compare with attention_forward on the same qkv (f32).
TEST_P(KvAttention, FullSequenceEqualsCausalAttention) {
  const int64_t T = 77, Hq = 4, Hkv = 2, D = 16, W = (Hq + 2 * Hkv) * D;
  Tensor qkv = make({1, T, W}, DType::F32, randn(size_t(T * W), 5), dev());
  Tensor out = Tensor::empty({1, T, Hq * D}, DType::F32, dev()),
         lse = Tensor::empty({1, Hq, T}, DType::F32, dev());
  ops::attention_forward(out, lse, qkv, Hq, Hkv);
  Tensor kc = make({2, Hkv, T, D}, DType::F32, std::vector<double>(size_t(2 * Hkv * T * D)), dev()),
         vc = make({2, Hkv, T, D}, DType::F32, std::vector<double>(size_t(2 * Hkv * T * D)), dev());
  std::vector<int32_t> slots(size_t(T), 1), positions(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions[size_t(t)] = int32_t(t);
  Tensor sl = make_i32({T}, slots, dev()), ps = make_i32({T}, positions, dev());
  Tensor got = Tensor::empty({T, Hq * D}, DType::F32, dev());
  Tensor q2 = qkv.view({T, W});
  ops::kv_cache_store(kc, vc, q2, Hq, sl, ps);
  ops::attention_cached(got, q2, kc, vc, Hq, sl, ps);
  expect_close(values(got), values(out), {1e-5, 1e-6}, "cached vs causal");
}

TEST_P(KvAttention, BadSlotOrPositionNamesTheToken) {
  Tensor qkv = make({2, 4 * 8}, DType::F32, std::vector<double>(64), dev());
  Tensor kc = make({2, 1, 8, 8}, DType::F32, std::vector<double>(128), dev()),
         vc = make({2, 1, 8, 8}, DType::F32, std::vector<double>(128), dev());
  Tensor out = Tensor::empty({2, 2 * 8}, DType::F32, dev());
  Tensor sl = make_i32({2}, {0, 2}, dev()), ps = make_i32({2}, {0, 0}, dev());
  EXPECT_TRUE(
      test::contains(test::error_of([&] { ops::attention_cached(out, qkv, kc, vc, 2, sl, ps); }),
                     "token 1 names cache slot 2"));
  sl = make_i32({2}, {0, 0}, dev());
  ps = make_i32({2}, {8, 0}, dev());
  EXPECT_TRUE(test::contains(test::error_of([&] { ops::kv_cache_store(kc, vc, qkv, 2, sl, ps); }),
                             "token 0 is at position 8"));
}

}  // namespace
}  // namespace nk
