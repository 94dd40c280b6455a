// ops::kv_cache_store + ops::attention_cached on every backend against the
// double reference (ops/ref/kv_attention.h), f32 and bf16, on a ragged mix of
// tokens: several sequences, prefill runs and single decode tokens, GQA and
// MHA; over the contiguous layout (one block per sequence) and paged ones
// (block sizes 1, 16, 64, blocks scattered through the pool, a prefix's blocks
// shared by two sequences). A paged cache gives the contiguous cache's bits.
// Also: the cached op over a fully stored sequence equals the causal
// attention_forward, and bad sequences, positions and blocks are errors naming
// the token.
//
// Tolerances: tol_for(dtype) of op_harness.h against the reference fed the
// same rounded inputs (f32: accumulation order only, 1e-4 rel; bf16: one
// output rounding, 2e-2). A cache narrower than the compute dtype (bf16 or
// f16 under f32, f16 under bf16): the reference reads the same rounded
// cache, so the compute dtype's tolerance holds, and the stored rows are
// exactly the rounded k and v.
#include <gtest/gtest.h>

#include <optional>

#include "core/parallel.h"
#include "ops/kv_attention_split.h"
#include "ops/op_harness.h"
#include "ops/ops.h"
#include "ops/ref/kv_attention.h"
#include "test_util.h"

namespace nk {
namespace {

using namespace test;  // the op harness: make, randn, expect_close, ...

// Q sequences of up to L = M * B positions in NB blocks of B; token n is
// sequence seqs[n] at position pos[n].
struct Case {
  int64_t Hq, Hkv, D, B, M, NB;
  std::vector<int32_t> table;  // [Q, M]
  std::vector<int32_t> seqs, pos;
  int64_t Q() const { return int64_t(table.size()) / M; }
};

class KvAttention : public BackendTest {};
NK_INSTANTIATE_BACKENDS(KvAttention);

// Runs the ops on `dev` and returns out; checks caches and out against the
// reference.
// kv: the caches' dtype (the compute dtype dt when unset); the reference
// stores qkv's k and v rounded to it.
std::vector<double> check_against_reference(Device dev, const Case& cs, DType dt,
                                            int64_t window = 0,
                                            std::optional<DType> kv = std::nullopt) {
  const DType ct = kv.value_or(dt);
  const int64_t N = int64_t(cs.seqs.size());
  ref::CacheDims d{N, cs.Hq, cs.Hkv, cs.D, cs.B, cs.M, cs.table.data()};
  const Shape cache_shape{cs.NB, cs.Hkv, cs.B, cs.D};
  const int64_t cache_n = cs.NB * cs.Hkv * cs.B * cs.D;
  // The caches start with random history: every position a token attends to
  // but does not store itself is "previously cached".
  std::vector<double> qkv = rounded(randn(size_t(N * d.row()), 1), dt);
  std::vector<double> kc = rounded(randn(size_t(cache_n), 2), ct);
  std::vector<double> vc = rounded(randn(size_t(cache_n), 3), ct);
  Tensor tq = make({N, d.row()}, dt, qkv, dev), tk = make(cache_shape, ct, kc, dev),
         tv = make(cache_shape, ct, vc, dev);
  Tensor tb = make_i32({cs.Q(), cs.M}, cs.table, dev);
  Tensor sq = make_i32({N}, cs.seqs, dev), ps = make_i32({N}, cs.pos, dev);
  Tensor out = Tensor::empty({N, cs.Hq * cs.D}, dt, dev);
  ops::kv_cache_store(tk, tv, tq, cs.Hq, tb, sq, ps);
  ops::attention_cached(out, tq, tk, tv, cs.Hq, tb, sq, ps, window);

  std::vector<double> want(size_t(N * cs.Hq * cs.D));
  ref::kv_cache_store(kc.data(), vc.data(), qkv.data(), cs.seqs.data(), cs.pos.data(), d);
  kc = rounded(kc, ct);  // the stored rows, rounded once (history is already)
  vc = rounded(vc, ct);
  ref::attention_cached(want.data(), qkv.data(), kc.data(), vc.data(), cs.seqs.data(),
                        cs.pos.data(), d, window);
  expect_close(values(tk), kc, {0, 0}, "k_cache");
  expect_close(values(tv), vc, {0, 0}, "v_cache");
  expect_close(values(out), want, tol_for(dt), "out");
  return values(out);
}

// Sequence 0: a 70-token prefill (crosses a 64 boundary); sequence 2: decode
// at 37; sequence 1: a 5-token prefill continuing at position 10; sequence 3:
// position 0. In the contiguous layout (block_size 0): one block of 96
// positions per sequence.
Case ragged(int64_t Hq, int64_t Hkv, int64_t D, int64_t block_size = 0) {
  const int64_t L = 96, B = block_size ? block_size : L, M = (L + B - 1) / B;
  Case c{Hq, Hkv, D, B, M, 0, {}, {}, {}};
  for (int32_t p = 0; p < 70; ++p) c.seqs.push_back(0), c.pos.push_back(p);
  c.seqs.push_back(2), c.pos.push_back(37);
  for (int32_t p = 10; p < 15; ++p) c.seqs.push_back(1), c.pos.push_back(p);
  c.seqs.push_back(3), c.pos.push_back(0);
  // Blocks dealt in a scrambled order (a pool after many opens and closes),
  // with two spare blocks no sequence names.
  c.NB = 4 * M + 2;
  for (int64_t i = 0; i < 4 * M; ++i) c.table.push_back(int32_t((i * 7 + 3) % (4 * M + 2)));
  return c;
}

NK_COVERS(KvAttention, MatchesReferenceF32, kv_cache_store, attention_cached);
TEST_P(KvAttention, MatchesReferenceF32) {
  for (int64_t B : {0, 1, 16, 64}) {
    SCOPED_TRACE(::testing::Message() << "block size " << B);
    check_against_reference(dev(), ragged(4, 2, 16, B), DType::F32);
    check_against_reference(dev(), ragged(3, 3, 24, B), DType::F32);
    check_against_reference(dev(), ragged(8, 1, 64, B), DType::F32);
  }
}

TEST_P(KvAttention, MatchesReferenceBf16) {
  for (int64_t B : {0, 16}) {
    SCOPED_TRACE(::testing::Message() << "block size " << B);
    check_against_reference(dev(), ragged(4, 2, 16, B), DType::BF16);
    check_against_reference(dev(), ragged(8, 1, 64, B), DType::BF16);
  }
}

// kv_cache_dtype: a cache in another dtype than the compute one, every
// pairing the ops take (stores round to the cache's dtype, reads widen).
TEST_P(KvAttention, MatchesReferenceWithCacheDtype) {
  const std::pair<DType, DType> pairs[] = {{DType::F32, DType::BF16},
                                           {DType::F32, DType::F16},
                                           {DType::BF16, DType::F32},
                                           {DType::BF16, DType::F16}};
  for (auto [dt, kv] : pairs)
    for (int64_t B : {0, 16}) {
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(dt) << " compute, " << dtype_name(kv) << " cache, block " << B);
      check_against_reference(dev(), ragged(4, 2, 16, B), dt, 0, kv);
      check_against_reference(dev(), ragged(8, 1, 64, B), dt, 0, kv);
      check_against_reference(dev(), ragged(3, 3, 24, B), dt, 9, kv);
    }
  // k and v must agree, and a cache dtype is a float one.
  Tensor qkv = make({1, 4 * 8}, DType::F32, std::vector<double>(32), dev());
  Tensor kc = make({1, 1, 8, 8}, DType::BF16, std::vector<double>(64), dev());
  Tensor vc = make({1, 1, 8, 8}, DType::F16, std::vector<double>(64), dev());
  Tensor tb = make_i32({1, 1}, {0}, dev());
  Tensor sq = make_i32({1}, {0}, dev()), ps = make_i32({1}, {0}, dev());
  try {
    ops::kv_cache_store(kc, vc, qkv, 2, tb, sq, ps);
    ADD_FAILURE() << "a bf16 k_cache beside an f16 v_cache was taken";
  } catch (const InternalError& e) {
    EXPECT_TRUE(test::contains(e.what(), "v_cache is f16, expected bf16")) << e.what();
  }
}

// ggml's block_q8_0 for each row of D values of x (D a multiple of 32), by
// its published rule: per 32 values the scale d = max|x| / 127 stored as
// f16, then each value as int8 round(x / d) with the stored d (nearest,
// ties to even: Nekton's rounding, ggml's roundf differs only at ties);
// each block is the scale's two bytes (little-endian) and the 32 values.
// `deq` gets the values the blocks hold (d q).
std::vector<uint8_t> q8_rows(const std::vector<double>& x, std::vector<double>& deq) {
  std::vector<uint8_t> bytes;
  deq.assign(x.size(), 0.0);
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0.f;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(float(x[b + j])));
    const uint16_t h = f32_to_f16(amax / 127.f).bits;
    const float d = f16_to_f32(f16{h}), inv = d > 0.f ? 1.f / d : 0.f;
    bytes.push_back(uint8_t(h & 0xff));
    bytes.push_back(uint8_t(h >> 8));
    for (size_t j = 0; j < 32; ++j) {
      const float q = std::clamp(std::nearbyint(float(x[b + j]) * inv), -127.f, 127.f);
      bytes.push_back(uint8_t(int8_t(q)));
      deq[b + j] = double(d) * double(q);
    }
  }
  return bytes;
}

// The q8_0 cache (kv_cache_dtype=q8_0; CPU only, refused by name on CUDA):
// after the store every row of the cache is the Q8_0 blocks of its k or v
// byte for byte (history rows untouched), and the output equals the
// reference over the dequantised cache within the compute dtype's
// tolerance. Returns out and, in `plain`, the output over an f32 cache of
// the same values unquantised.
std::vector<double> check_q8_against_reference(Device dev, const Case& cs, DType dt, int64_t window,
                                               std::vector<double>& plain) {
  const int64_t N = int64_t(cs.seqs.size());
  ref::CacheDims d{N, cs.Hq, cs.Hkv, cs.D, cs.B, cs.M, cs.table.data()};
  const Shape cache_shape{cs.NB, cs.Hkv, cs.B, cs.D / 32 * 34};
  const int64_t cache_n = cs.NB * cs.Hkv * cs.B * cs.D;
  std::vector<double> qkv = rounded(randn(size_t(N * d.row()), 1), dt);
  std::vector<double> kc = randn(size_t(cache_n), 2), vc = randn(size_t(cache_n), 3), unused;
  auto to_u8 = [&](const std::vector<uint8_t>& bytes) {
    Tensor t = Tensor::empty(cache_shape, DType::U8);
    std::copy(bytes.begin(), bytes.end(), t.data<uint8_t>());
    return to_device(t, dev);
  };
  Tensor tk = to_u8(q8_rows(kc, unused)), tv = to_u8(q8_rows(vc, unused));
  Tensor tq = make({N, d.row()}, dt, qkv, dev);
  Tensor tb = make_i32({cs.Q(), cs.M}, cs.table, dev);
  Tensor sq = make_i32({N}, cs.seqs, dev), ps = make_i32({N}, cs.pos, dev);
  Tensor out = Tensor::empty({N, cs.Hq * cs.D}, dt, dev);
  ops::kv_cache_store(tk, tv, tq, cs.Hq, tb, sq, ps);
  ops::attention_cached(out, tq, tk, tv, cs.Hq, tb, sq, ps, window);

  ref::kv_cache_store(kc.data(), vc.data(), qkv.data(), cs.seqs.data(), cs.pos.data(), d);
  std::vector<double> kq, vq;
  const std::vector<uint8_t> kb = q8_rows(kc, kq), vb = q8_rows(vc, vq);
  auto bytes_of = [](const Tensor& t) {
    const Tensor h = to_host(t);
    return std::vector<uint8_t>(h.data<uint8_t>(), h.data<uint8_t>() + h.numel());
  };
  EXPECT_EQ(bytes_of(tk), kb) << "k_cache";
  EXPECT_EQ(bytes_of(tv), vb) << "v_cache";
  std::vector<double> want(size_t(N * cs.Hq * cs.D));
  ref::attention_cached(want.data(), qkv.data(), kq.data(), vq.data(), cs.seqs.data(),
                        cs.pos.data(), d, window);
  expect_close(values(out), want, tol_for(dt), "out");
  plain.assign(want.size(), 0.0);
  ref::attention_cached(plain.data(), qkv.data(), kc.data(), vc.data(), cs.seqs.data(),
                        cs.pos.data(), d, window);
  return values(out);
}

TEST_P(KvAttention, MatchesReferenceWithQ8Cache) {
  if (dev() != kHost) {
    Tensor qkv = make({1, 4 * 32}, DType::F32, std::vector<double>(128), dev());
    Tensor kc = to_device(Tensor::zeros({1, 1, 8, 34}, DType::U8), dev());
    Tensor tb = make_i32({1, 1}, {0}, dev());
    Tensor sq = make_i32({1}, {0}, dev()), ps = make_i32({1}, {0}, dev());
    EXPECT_TRUE(
        test::contains(test::error_of([&] { ops::kv_cache_store(kc, kc, qkv, 2, tb, sq, ps); }),
                       "a q8_0 KV cache has no CUDA kernel yet"));
    return;
  }
  double worst = 0;
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t B : {0, 16}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " compute, block " << B);
      std::vector<double> plain;
      for (auto [c, window] :
           {std::pair{ragged(4, 2, 32, B), int64_t(0)}, std::pair{ragged(8, 1, 64, B), int64_t(0)},
            std::pair{ragged(3, 3, 96, B), int64_t(9)}}) {
        const std::vector<double> got = check_q8_against_reference(dev(), c, dt, window, plain);
        for (size_t i = 0; i < got.size(); ++i)
          worst = std::max(worst, std::fabs(got[i] - plain[i]));
      }
    }
  // What q8_0 costs against the unquantised cache (unit normal k, v and q):
  // each value within half a step, max|x| / 254, of its block.
  EXPECT_LT(worst, 0.05) << "q8_0 against an f32 cache";
  EXPECT_GT(worst, 0.0) << "the q8_0 cache gave the unquantised outputs: nothing was quantised";
  // A row of values that is not whole blocks of 32 cannot be a q8_0 row.
  EXPECT_TRUE(test::contains(test::error_of([] { ops::kv_cache_row_width(48, DType::U8); }),
                             "multiple of 32 values (kv_cache_dtype=q8_0)"));
  EXPECT_EQ(ops::kv_cache_row_width(128, DType::U8), 136);
  EXPECT_EQ(ops::kv_cache_row_width(48, DType::BF16), 48);
}

// The same logical history in blocks of any size gives the same bits: the
// paged layout changes addresses, not arithmetic. History is random per
// layout, so compare the decode of a freshly stored sequence: 40 tokens
// stored and attended to in one call.
TEST_P(KvAttention, PagedEqualsContiguousBitForBit) {
  std::vector<double> first;
  for (int64_t B : {0, 1, 16, 64}) {
    const int64_t L = 64, Bs = B ? B : L, M = L / Bs;
    Case c{4, 2, 16, Bs, M, M + 3, {}, {}, {}};
    for (int64_t i = 0; i < M; ++i) c.table.push_back(int32_t((i * 5 + 2) % (M + 3)));
    for (int32_t p = 0; p < 40; ++p) c.seqs.push_back(0), c.pos.push_back(p);
    const std::vector<double> got = check_against_reference(dev(), c, DType::F32);
    if (first.empty())
      first = got;
    else
      EXPECT_EQ(got, first) << "block size " << B;
  }
}

// Two sequences whose tables share their first blocks (a cached prefix): the
// second, decoding past the shared part, reads the first one's k and v.
TEST_P(KvAttention, SharedPrefixBlocks) {
  for (DType dt : {DType::F32, DType::BF16}) {
    Case c{4, 2, 16, 16, 4, 9, {}, {}, {}};
    c.table = {5, 0, 7, 2,   // sequence 0
               5, 0, 3, 8};  // sequence 1: blocks 5 and 0 (positions 0..31) shared
    for (int32_t p = 0; p < 40; ++p) c.seqs.push_back(0), c.pos.push_back(p);
    for (int32_t p = 32; p < 36; ++p) c.seqs.push_back(1), c.pos.push_back(p);
    check_against_reference(dev(), c, dt);
  }
}

// Sliding windows: 1, shorter than the prefill run, longer than every position.
TEST_P(KvAttention, MatchesReferenceWithWindow) {
  for (int64_t window : {1, 9, 40, 200}) {
    SCOPED_TRACE(::testing::Message() << "window " << window);
    check_against_reference(dev(), ragged(4, 2, 16), DType::F32, window);
    check_against_reference(dev(), ragged(4, 2, 16, 16), DType::F32, window);
    check_against_reference(dev(), ragged(8, 1, 64), DType::BF16, window);
  }
  Tensor qkv = make({1, 4 * 8}, DType::F32, std::vector<double>(32), dev());
  Tensor kc = make({1, 1, 8, 8}, DType::F32, std::vector<double>(64), dev());
  Tensor out = Tensor::empty({1, 2 * 8}, DType::F32, dev());
  Tensor tb = make_i32({1, 1}, {0}, dev());
  Tensor sq = make_i32({1}, {0}, dev()), ps = make_i32({1}, {0}, dev());
  EXPECT_THROW(ops::attention_cached(out, qkv, kc, kc, 2, tb, sq, ps, -1), InternalError);
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
  std::vector<int32_t> seqs(size_t(T), 1), positions(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions[size_t(t)] = int32_t(t);
  Tensor tb = make_i32({2, 1}, {0, 1}, dev());
  Tensor sq = make_i32({T}, seqs, dev()), ps = make_i32({T}, positions, dev());
  Tensor got = Tensor::empty({T, Hq * D}, DType::F32, dev());
  Tensor q2 = qkv.view({T, W});
  ops::kv_cache_store(kc, vc, q2, Hq, tb, sq, ps);
  ops::attention_cached(got, q2, kc, vc, Hq, tb, sq, ps);
  expect_close(values(got), values(out), {1e-5, 1e-6}, "cached vs causal");
}

// The CPU takes a prefill run's tokens in tiles that share each cache row
// (ops/cpu/kv_attention.cc): a call over the ragged mix (a 70-token run
// across tiles of 16, a run of 5, single tokens; two sequences' runs side
// by side in the table's order) gives each token the bits of a call over
// that token alone, f32 and bf16, with and without a window, in bf16 and
// q8_0 caches; a latent-style call (one kv head, 32 query heads of 64,
// tiles cut short by the score budget at a long context) too.
TEST_P(KvAttention, PrefillTilesEqualTokenByToken) {
  struct Run {
    Case c;
    DType dt;
    int64_t window;
    DType kv;
  };
  Case latent{32, 1, 64, 4096, 1, 1, {0}, {}, {}};  // 32 x 4040 scores a token: tiles of 8
  for (int32_t p = 0; p < 40; ++p) latent.seqs.push_back(0), latent.pos.push_back(4000 + p);
  const Run runs[] = {{ragged(4, 2, 32), DType::F32, 0, DType::F32},
                      {ragged(4, 2, 32, 16), DType::BF16, 0, DType::BF16},
                      {ragged(4, 2, 32), DType::F32, 9, DType::F32},
                      {ragged(8, 2, 32, 16), DType::F32, 0, DType::BF16},
                      {ragged(4, 1, 64), DType::F32, 40, DType::U8},
                      {latent, DType::F32, 0, DType::F32}};
  for (const Run& r : runs) {
    const Case& cs = r.c;
    SCOPED_TRACE(::testing::Message() << cs.Hq << " heads over " << cs.Hkv << ", "
                                      << dtype_name(r.dt) << ", window " << r.window);
    if (r.kv == DType::U8 && dev() != kHost) continue;  // q8_0 is CPU only
    const int64_t N = int64_t(cs.seqs.size()), row = (cs.Hq + 2 * cs.Hkv) * cs.D;
    const int64_t W = ops::kv_cache_row_width(cs.D, r.kv);
    Tensor qkv = make({N, row}, r.dt, randn(size_t(N * row), 11), dev());
    Tensor kc = Tensor::zeros({cs.NB, cs.Hkv, cs.B, W}, r.kv, dev()),
           vc = Tensor::zeros({cs.NB, cs.Hkv, cs.B, W}, r.kv, dev());
    Tensor tb = make_i32({cs.Q(), cs.M}, cs.table, dev());
    Tensor sq = make_i32({N}, cs.seqs, dev()), ps = make_i32({N}, cs.pos, dev());
    Tensor out = Tensor::empty({N, cs.Hq * cs.D}, r.dt, dev());
    ops::kv_cache_store(kc, vc, qkv, cs.Hq, tb, sq, ps);
    ops::attention_cached(out, qkv, kc, vc, cs.Hq, tb, sq, ps, r.window);
    const std::vector<double> all = values(out);
    const int64_t O = cs.Hq * cs.D;
    for (int64_t n = 0; n < N; ++n) {
      Tensor one = Tensor::empty({1, O}, r.dt, dev());
      Tensor s1 = make_i32({1}, {cs.seqs[size_t(n)]}, dev()),
             p1 = make_i32({1}, {cs.pos[size_t(n)]}, dev());
      ops::attention_cached(one, qkv.narrow0(n, 1), kc, vc, cs.Hq, tb, s1, p1, r.window);
      const std::vector<double> got = values(one);
      ASSERT_EQ(got, std::vector<double>(all.begin() + n * O, all.begin() + (n + 1) * O))
          << "token " << n;
    }
  }
}

// How the CPU deals a call's work (ops/kv_attention_split.h): the query
// heads of a (token, kv head) pair are cut into runs only when there are
// fewer pairs than threads.
TEST(KvAttentionSplit, CutsTheHeadsOnlyWhenPairsAreFewerThanThreads) {
  auto eq = [](ops::KvAttentionSplit s, int64_t runs, int64_t heads) {
    EXPECT_EQ(s.runs, runs);
    EXPECT_EQ(s.run_heads, heads);
  };
  eq(ops::kv_attention_split(1, 128, 16), 16, 8);  // DeepSeek-V3's decode: 128 heads, one latent
  eq(ops::kv_attention_split(1, 4, 16), 4, 1);     // fewer heads than threads: one each
  eq(ops::kv_attention_split(1, 5, 3), 3, 2);      // runs of 2, 2, 1
  eq(ops::kv_attention_split(2, 8, 4), 2, 4);
  eq(ops::kv_attention_split(3, 8, 4), 2, 4);    // ceil(4 / 3) = 2 runs per pair
  eq(ops::kv_attention_split(16, 8, 16), 1, 8);  // enough pairs: whole groups
  eq(ops::kv_attention_split(70, 8, 2), 1, 8);   // a prefill
  eq(ops::kv_attention_split(1, 1, 16), 1, 1);   // multi-head attention: nothing to cut
  eq(ops::kv_attention_split(1, 8, 1), 1, 8);    // one thread
}

// Decode calls with fewer (token, kv head) pairs than threads, their query
// heads cut into runs (one latent head as MLA's cache, multi-query,
// grouped-query, 5 heads in uneven runs; a window; a bf16 cache): the output
// has the same bits for every thread count, and matches the reference.
TEST_P(KvAttention, SameBitsForEveryThreadCount) {
  auto decode = [](int64_t Hq, int64_t Hkv, int64_t D, std::vector<int32_t> pos) {
    const int64_t B = 16, M = 6;
    Case c{Hq, Hkv, D, B, M, int64_t(pos.size()) * M + 1, {}, {}, {}};
    for (int64_t i = 0; i < int64_t(pos.size()) * M; ++i)
      c.table.push_back(int32_t((i * 5 + 1) % c.NB));
    for (size_t q = 0; q < pos.size(); ++q) c.seqs.push_back(int32_t(q)), c.pos.push_back(pos[q]);
    return c;
  };
  struct Run {
    Case c;
    DType dt;
    int64_t window;
    std::optional<DType> kv;
  };
  const Run runs[] = {{decode(4, 1, 40, {57}), DType::F32, 0, std::nullopt},
                      {decode(8, 1, 64, {90}), DType::BF16, 0, std::nullopt},
                      {decode(8, 2, 16, {33, 70}), DType::F32, 0, std::nullopt},
                      {decode(5, 1, 24, {40}), DType::F32, 9, std::nullopt},
                      {decode(16, 1, 32, {80}), DType::F32, 0, DType::BF16}};
  const int saved = num_threads();
  for (const Run& r : runs) {
    SCOPED_TRACE(::testing::Message()
                 << r.c.Hq << " heads over " << r.c.Hkv << ", " << r.c.seqs.size() << " token(s)");
    set_num_threads(1);
    const std::vector<double> one = check_against_reference(dev(), r.c, r.dt, r.window, r.kv);
    for (int threads : {2, 3, 8}) {
      set_num_threads(threads);
      EXPECT_EQ(check_against_reference(dev(), r.c, r.dt, r.window, r.kv), one)
          << threads << " threads";
    }
  }
  set_num_threads(saved);
}

TEST_P(KvAttention, BadSequencePositionOrBlockNamesTheToken) {
  // Two blocks of 8 positions; two sequences of up to 2 blocks.
  Tensor qkv = make({2, 4 * 8}, DType::F32, std::vector<double>(64), dev());
  Tensor kc = make({2, 1, 8, 8}, DType::F32, std::vector<double>(128), dev()),
         vc = make({2, 1, 8, 8}, DType::F32, std::vector<double>(128), dev());
  Tensor out = Tensor::empty({2, 2 * 8}, DType::F32, dev());
  Tensor tb = make_i32({2, 2}, {0, 1, 1, 2}, dev());
  auto attend = [&](std::vector<int32_t> seqs, std::vector<int32_t> pos) {
    Tensor sq = make_i32({2}, seqs, dev()), ps = make_i32({2}, pos, dev());
    return test::error_of([&] { ops::attention_cached(out, qkv, kc, vc, 2, tb, sq, ps); });
  };
  EXPECT_TRUE(test::contains(attend({0, 2}, {0, 0}), "token 1 names sequence 2"));
  EXPECT_TRUE(test::contains(attend({0, 0}, {16, 0}), "token 0 is at position 16"));
  // Sequence 1's second block is 2, outside the pool of 2 blocks.
  EXPECT_TRUE(
      test::contains(attend({0, 1}, {3, 9}), "token 1 (sequence 1, position 9) reads block 2"));
  EXPECT_EQ(attend({0, 1}, {3, 7}), "(no error)");
  Tensor sq = make_i32({2}, {0, 0}, dev()), ps = make_i32({2}, {0, 16}, dev());
  EXPECT_TRUE(
      test::contains(test::error_of([&] { ops::kv_cache_store(kc, vc, qkv, 2, tb, sq, ps); }),
                     "token 1 is at position 16"));
}

}  // namespace
}  // namespace nk
