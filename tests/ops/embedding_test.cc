// Token + position embedding: reference backward vs finite differences, the
// ops on every backend vs the reference (f32, bf16), accumulation, skipped
// gradients, bad ids, determinism.
#include "ops/ref/embedding.h"
#include "core/parallel.h"
#include "ops/op_harness.h"
#include "ops/ops.h"

namespace nk {
namespace {

using namespace test;  // the op harness: make, randn, expect_close, ...
using Vec = std::vector<double>;

// Token ids with repeats, so the scatter-add in the backward has collisions.
Vec token_ids(int64_t n, int64_t V, uint64_t seed) {
  Rng r(seed);
  Vec t(n);
  for (auto& v : t) v = double(r.below(uint64_t(V)));
  return t;
}

std::vector<int32_t> as_i32(const Vec& v) {
  return std::vector<int32_t>(v.begin(), v.end());
}

TEST(EmbeddingRef, BackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 3, C = 5, V = 4;
  auto tok = as_i32(token_ids(B * T, V, 1));
  Vec wte = randn(V * C, 2), wpe = randn(T * C, 3), dy = randn(B * T * C, 4);
  Vec dwte(V * C), dwpe(T * C);
  ref::embedding_backward(dwte.data(), dwpe.data(), dy.data(), tok.data(), B, T, C);
  auto loss = [&](const Vec& e, const Vec& p) {
    Vec y(B * T * C);
    ref::embedding_forward(y.data(), tok.data(), e.data(), p.data(), B, T, C);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
    return s;
  };
  check_grad_fd([&](const Vec& e) { return loss(e, wpe); }, wte, dwte, "dwte");
  check_grad_fd([&](const Vec& p) { return loss(wte, p); }, wpe, dwpe, "dwpe");
}

class EmbeddingFast : public BackendTest {};
NK_INSTANTIATE_BACKENDS(EmbeddingFast);

void embedding_vs_ref(Device dev, DType dt, int64_t B, int64_t T, int64_t C, int64_t V,
                      bool with_wpe) {
  SCOPED_TRACE(testing::Message() << dtype_name(dt) << " B=" << B << " T=" << T << " C=" << C
                                  << " wpe=" << with_wpe);
  const int64_t maxT = T + 2;
  Vec tok = token_ids(B * T, V, 5);
  Vec wte = rounded(randn(V * C, 6), dt), wpe = rounded(randn(maxT * C, 7), dt);
  Vec dy = rounded(randn(B * T * C, 8), dt);
  Vec dwte0 = rounded(randn(V * C, 9), DType::F32),
      dwpe0 = rounded(randn(maxT * C, 10), DType::F32);
  Tensor ttok = make({B, T}, DType::I32, tok, dev);
  Tensor twpe = with_wpe ? make({maxT, C}, dt, wpe, dev) : Tensor();
  Tensor out = Tensor::empty({B, T, C}, dt, dev);
  ops::embedding_forward(out, ttok, make({V, C}, dt, wte, dev), twpe);
  Tensor tdwte = make({V, C}, DType::F32, dwte0, dev),
         tdwpe = make({maxT, C}, DType::F32, dwpe0, dev);
  ops::embedding_backward(tdwte, with_wpe ? tdwpe : Tensor(), make({B, T, C}, dt, dy, dev), ttok);

  auto itok = as_i32(tok);
  Vec y(B * T * C), dwte = dwte0, dwpe = dwpe0;
  ref::embedding_forward(y.data(), itok.data(), wte.data(), with_wpe ? wpe.data() : nullptr, B, T,
                         C);
  ref::embedding_backward(dwte.data(), with_wpe ? dwpe.data() : nullptr, dy.data(), itok.data(), B,
                          T, C);
  expect_close(values(out), y, tol_for(dt), "out");
  // Gradients are f32 sums of dtype-exact values: fp32 accumulation error only.
  expect_close(values(tdwte), dwte, tol_for(DType::F32), "dwte");
  expect_close(values(tdwpe), dwpe, tol_for(DType::F32), "dwpe");
}

NK_COVERS(EmbeddingFast, MatchesReference, embedding_forward, embedding_backward);
TEST_P(EmbeddingFast, MatchesReference) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (bool wpe : {true, false}) {
      embedding_vs_ref(dev(), dt, 1, 1, 7, 3, wpe);
      embedding_vs_ref(dev(), dt, 3, 5, 33, 11, wpe);
      embedding_vs_ref(dev(), dt, 4, 64, 200, 50, wpe);
    }
  }
}

// Frozen tables: an undefined dwte or dwpe is not computed, and the other is
// bit-identical to a call computing both (implicit and explicit positions).
TEST_P(EmbeddingFast, SkippedGradientLeavesTheOtherUnchanged) {
  const int64_t B = 3, T = 20, C = 70, V = 9, maxT = 24;
  const Device d = dev();
  Tensor tok = make({B, T}, DType::I32, token_ids(B * T, V, 31), d);
  std::vector<int32_t> pos(size_t(B * T));
  for (int64_t n = 0; n < B * T; ++n) pos[size_t(n)] = int32_t((n * 7) % maxT);
  const Vec dwte0 = randn(V * C, 32), dwpe0 = randn(maxT * C, 33);
  for (DType dt : {DType::F32, DType::BF16})
    for (bool explicit_pos : {false, true}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " positions=" << explicit_pos);
      Tensor dy = make({B, T, C}, dt, randn(B * T * C, 34), d);
      Tensor positions = explicit_pos ? make_i32({B, T}, pos, d) : Tensor();
      auto run = [&](bool want_wte, bool want_wpe) {
        Tensor dwte = want_wte ? make({V, C}, DType::F32, dwte0, d) : Tensor();
        Tensor dwpe = want_wpe ? make({maxT, C}, DType::F32, dwpe0, d) : Tensor();
        ops::embedding_backward(dwte, dwpe, dy, tok, positions);
        return std::pair{want_wte ? values(dwte) : Vec(), want_wpe ? values(dwpe) : Vec()};
      };
      const auto both = run(true, true);
      EXPECT_EQ(run(true, false).first, both.first) << "dwte without dwpe";
      EXPECT_EQ(run(false, true).second, both.second) << "dwpe without dwte";
      EXPECT_NO_THROW(run(false, false));
    }
}

// A vocabulary split over shards (tensor parallelism): each shard looks up
// the ids it holds and zeros for the others, only the first adds positions,
// and the sum over shards is the plain lookup exactly; each shard's
// backward fills its rows of the plain gradient and the positions' whole one.
TEST_P(EmbeddingFast, VocabularyShardsSumToThePlainLookup) {
  const int64_t B = 2, T = 9, C = 12, V = 12, maxT = 16, S = 3, Vs = V / S;
  const Device d = dev();
  Tensor tok = make({B, T}, DType::I32, token_ids(B * T, V, 41), d);
  const Vec wte = randn(V * C, 42), wpe = randn(maxT * C, 43), dy = randn(B * T * C, 44);
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor out = Tensor::empty({B, T, C}, dt, d);
    ops::embedding_forward(out, tok, make({V, C}, dt, wte, d), make({maxT, C}, dt, wpe, d));
    Tensor dwte = make({V, C}, DType::F32, Vec(V * C), d),
           dwpe = make({maxT, C}, DType::F32, Vec(maxT * C), d), tdy = make({B, T, C}, dt, dy, d);
    ops::embedding_backward(dwte, dwpe, tdy, tok);
    Vec sum(size_t(B * T * C), 0.f);
    for (int64_t s = 0; s < S; ++s) {
      const Vec rows(wte.begin() + s * Vs * C, wte.begin() + (s + 1) * Vs * C);
      Tensor o = Tensor::empty({B, T, C}, dt, d);
      ops::embedding_forward(o, tok, make({Vs, C}, dt, rows, d),
                             s == 0 ? make({maxT, C}, dt, wpe, d) : Tensor(), Tensor(), s * Vs);
      const Vec v = values(o);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += v[i];
      Tensor g = make({Vs, C}, DType::F32, Vec(Vs * C), d),
             gp = make({maxT, C}, DType::F32, Vec(maxT * C), d);
      ops::embedding_backward(g, gp, tdy, tok, Tensor(), s * Vs);
      const Vec whole = values(dwte);
      EXPECT_EQ(values(g), Vec(whole.begin() + s * Vs * C, whole.begin() + (s + 1) * Vs * C))
          << "shard " << s;
      EXPECT_EQ(values(gp), values(dwpe)) << "shard " << s;
    }
    // One shard holds each token: adding zeros changes no bit (f32 sum, then
    // one rounding to the dtype as the all-reduce does).
    Tensor summed = make({B, T, C}, dt, sum, d);
    EXPECT_EQ(values(summed), values(out));
  }
}

TEST_P(EmbeddingFast, BadTokenIsAUserErrorNamingIdAndPosition) {
  const int64_t V = 10, C = 4;
  Tensor wte = make({V, C}, DType::F32, Vec(V * C), dev()),
         out = Tensor::empty({2, 3, C}, DType::F32, dev());
  for (double bad : {10.0, -1.0}) {
    Tensor tok = make({2, 3}, DType::I32, {1, 2, 3, 4, bad, 5}, dev());
    try {
      ops::embedding_forward(out, tok, wte, Tensor());
      ADD_FAILURE() << "no error for token " << bad;
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(std::to_string(int(bad))), std::string::npos) << msg;
      EXPECT_NE(msg.find("position 4"), std::string::npos) << msg;
    }
  }
}

TEST_P(EmbeddingFast, BackwardIsBitIdenticalAcrossThreadCounts) {
  const int64_t B = 4, T = 50, C = 300, V = 7;
  Tensor tok = make({B, T}, DType::I32, token_ids(B * T, V, 11), dev());
  Tensor dy = make({B, T, C}, DType::BF16, randn(B * T * C, 12), dev());
  std::vector<Vec> results;
  const int saved = num_threads();
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tensor dwte = make({V, C}, DType::F32, Vec(V * C), dev()),
           dwpe = make({T, C}, DType::F32, Vec(T * C), dev());
    ops::embedding_backward(dwte, dwpe, dy, tok);
    Vec all = values(dwte);
    for (double v : values(dwpe)) all.push_back(v);
    results.push_back(all);
  }
  set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

}  // namespace
}  // namespace nk
