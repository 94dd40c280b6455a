// Explicit position ids (packed rows restart positions per document) in the
// learned position embedding and in RoPE, against the implicit 0..T-1 path
// run on each document alone: exact, since the same table rows and the same
// per-element arithmetic are used.
#include <gtest/gtest.h>

#include "op_harness.h"
#include "ops/ops.h"

namespace nk {
namespace {

using test::values;

class PositionIds : public test::BackendTest {
 protected:
  Tensor i32(const Shape& s, const std::vector<int32_t>& v) const {
    return test::make_i32(s, v, dev());
  }
};
NK_INSTANTIATE_BACKENDS(PositionIds);

// One row of T = 7 holding documents [0, 3) and [3, 7).
const std::vector<int32_t> kPos = {0, 1, 2, 0, 1, 2, 3};

TEST_P(PositionIds, RopeRestartsPerDocument) {
  const int64_t T = 7, H = 3, D = 8, W = H * D + 5;
  const Tensor table = test::to_device(ops::rope_table(16, D, 10000.0), dev());
  const auto x = test::randn(T * W, 1);
  Tensor packed = test::make({1, T, W}, DType::F32, x, dev());
  ops::rope_inplace(packed, H, D, table, i32({1, T}, kPos));
  for (auto [s, n] : {std::pair<int64_t, int64_t>{0, 3}, {3, 4}}) {
    Tensor alone =
        test::make({1, n, W}, DType::F32,
                   std::vector<double>(x.begin() + s * W, x.begin() + (s + n) * W), dev());
    ops::rope_inplace(alone, H, D, table);
    const auto p = values(packed);
    EXPECT_EQ(std::vector<double>(p.begin() + s * W, p.begin() + (s + n) * W), values(alone));
  }
  // The inverse undoes the forward.
  ops::rope_inplace(packed, H, D, table, i32({1, T}, kPos), /*inverse=*/true);
  test::expect_close(values(packed), x, {1e-6, 1e-6}, "inverse");
  // Out-of-table positions are the data's fault.
  EXPECT_THROW(ops::rope_inplace(packed, H, D, table, i32({1, T}, {0, 1, 2, 16, 0, 0, 0})), Error);
}

TEST_P(PositionIds, LearnedPositionsRestartPerDocument) {
  const int64_t T = 7, V = 5, C = 6, maxT = 8;
  const auto wte_v = test::randn(V * C, 2), wpe_v = test::randn(maxT * C, 3);
  const Tensor wte = test::make({V, C}, DType::F32, wte_v, dev());
  const Tensor wpe = test::make({maxT, C}, DType::F32, wpe_v, dev());
  const std::vector<int32_t> tok = {1, 4, 0, 2, 2, 3, 1};
  Tensor out = Tensor::empty({1, T, C}, DType::F32, dev());
  ops::embedding_forward(out, i32({1, T}, tok), wte, wpe, i32({1, T}, kPos));
  const auto o = values(out);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c)
      EXPECT_EQ(o[t * C + c], double(float(wte_v[tok[t] * C + c]) + float(wpe_v[kPos[t] * C + c])));

  const auto dout_v = test::randn(T * C, 4);
  Tensor dwte = test::make({V, C}, DType::F32, std::vector<double>(V * C), dev());
  Tensor dwpe = test::make({maxT, C}, DType::F32, std::vector<double>(maxT * C), dev());
  ops::embedding_backward(dwte, dwpe, test::make({1, T, C}, DType::F32, dout_v, dev()),
                          i32({1, T}, tok), i32({1, T}, kPos));
  std::vector<double> want(maxT * C, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) want[kPos[t] * C + c] += double(float(dout_v[t * C + c]));
  test::expect_close(values(dwpe), want, {1e-6, 1e-6}, "dwpe");
  EXPECT_THROW(
      ops::embedding_forward(out, i32({1, T}, tok), wte, wpe, i32({1, T}, {0, 1, 2, 8, 0, 0, 0})),
      Error);
}

// Several sequences in one row (the cached generator's prefill of a batch of
// prompts) may be longer than the position table: each position is within it.
TEST_P(PositionIds, ARowLongerThanThePositionTable) {
  const int64_t T = 12, V = 5, C = 4, maxT = 8;
  const std::vector<int32_t> pos = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5};
  const auto wte_v = test::randn(V * C, 5), wpe_v = test::randn(maxT * C, 6);
  const Tensor wte = test::make({V, C}, DType::F32, wte_v, dev());
  const Tensor wpe = test::make({maxT, C}, DType::F32, wpe_v, dev());
  const std::vector<int32_t> tok = {1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2};
  Tensor out = Tensor::empty({1, T, C}, DType::F32, dev());
  ops::embedding_forward(out, i32({1, T}, tok), wte, wpe, i32({1, T}, pos));
  const auto o = values(out);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c)
      EXPECT_EQ(o[t * C + c], double(float(wte_v[tok[t] * C + c]) + float(wpe_v[pos[t] * C + c])));
  Tensor dwpe = test::make({maxT, C}, DType::F32, std::vector<double>(maxT * C), dev());
  ops::embedding_backward(Tensor(), dwpe,
                          test::make({1, T, C}, DType::F32, test::randn(T * C, 7), dev()),
                          i32({1, T}, tok), i32({1, T}, pos));
  // Without explicit positions the row needs T table rows.
  EXPECT_THROW(ops::embedding_forward(out, i32({1, T}, tok), wte, wpe), InternalError);
}

}  // namespace
}  // namespace nk
