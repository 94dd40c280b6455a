// Token + position embedding: reference backward vs finite differences, fast
// CPU ops vs the reference (f32, bf16), accumulation, bad ids, determinism.
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

void embedding_vs_ref(DType dt, int64_t B, int64_t T, int64_t C, int64_t V, bool with_wpe) {
  SCOPED_TRACE(testing::Message() << dtype_name(dt) << " B=" << B << " T=" << T << " C=" << C
                                  << " wpe=" << with_wpe);
  const int64_t maxT = T + 2;
  Vec tok = token_ids(B * T, V, 5);
  Vec wte = rounded(randn(V * C, 6), dt), wpe = rounded(randn(maxT * C, 7), dt);
  Vec dy = rounded(randn(B * T * C, 8), dt);
  Vec dwte0 = rounded(randn(V * C, 9), DType::F32),
      dwpe0 = rounded(randn(maxT * C, 10), DType::F32);
  Tensor ttok = make({B, T}, DType::I32, tok);
  Tensor twpe = with_wpe ? make({maxT, C}, dt, wpe) : Tensor();
  Tensor out = Tensor::empty({B, T, C}, dt);
  ops::embedding_forward(out, ttok, make({V, C}, dt, wte), twpe);
  Tensor tdwte = make({V, C}, DType::F32, dwte0), tdwpe = make({maxT, C}, DType::F32, dwpe0);
  ops::embedding_backward(tdwte, with_wpe ? tdwpe : Tensor(), make({B, T, C}, dt, dy), ttok);

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

TEST(EmbeddingFast, MatchesReference) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (bool wpe : {true, false}) {
      embedding_vs_ref(dt, 1, 1, 7, 3, wpe);
      embedding_vs_ref(dt, 3, 5, 33, 11, wpe);
      embedding_vs_ref(dt, 4, 64, 200, 50, wpe);
    }
  }
}

TEST(EmbeddingFast, BadTokenIsAUserErrorNamingIdAndPosition) {
  const int64_t V = 10, C = 4;
  Tensor wte = Tensor::zeros({V, C}, DType::F32), out = Tensor::empty({2, 3, C}, DType::F32);
  for (double bad : {10.0, -1.0}) {
    Tensor tok = make({2, 3}, DType::I32, {1, 2, 3, 4, bad, 5});
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

TEST(EmbeddingFast, BackwardIsBitIdenticalAcrossThreadCounts) {
  const int64_t B = 4, T = 50, C = 300, V = 7;
  Tensor tok = make({B, T}, DType::I32, token_ids(B * T, V, 11));
  Tensor dy = make({B, T, C}, DType::BF16, randn(B * T * C, 12));
  std::vector<Vec> results;
  const int saved = num_threads();
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tensor dwte = Tensor::zeros({V, C}, DType::F32), dwpe = Tensor::zeros({T, C}, DType::F32);
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
