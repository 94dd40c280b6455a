// A packed batch (several documents per row, data/packing.h) gives the same
// loss and parameter gradients as the documents run alone, one sequence each,
// for a GPT-2-style model (learned positions) and a Llama-style one (RoPE,
// grouped-query attention).
//
// Normalisation: the packed loss is the mean over all N valid targets of the
// batch; document d alone has mean loss L_d over its n_d valid targets. So
// packed loss = sum_d L_d n_d / N, and running each document with grad_scale
// n_d / N accumulates exactly the packed gradients.
//
// Tolerance (fp32): loss 1e-5 relative; each parameter's gradient within
// 1e-4 of that gradient's largest element. The two runs do the same
// arithmetic in different summation orders (tile alignment in attention,
// matrix-product blocking over different row counts), ~1e-6 over two layers;
// a leak across a boundary or a wrong position changes gradients by O(1).
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "data/dataset/packing.h"
#include "model/transformer.h"

#include "model/tiny_config.h"

namespace nk {
namespace {

Tensor i32(const Shape& s, const int32_t* v) {
  Tensor t = Tensor::empty(s, DType::I32);
  std::copy_n(v, t.numel(), t.data<int32_t>());
  return t;
}

std::vector<float> host(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  ops::copy_to_host(t, v.data());
  return v;
}

ModelConfig tiny(bool llama) {
  return test::tiny_config(llama, 50, 32);
}

void check_packed_equals_alone(const ModelConfig& cfg) {
  // 57 tokens into rows of 32: FFD puts {20, 12} in row 0 and {9, 7, 5, 3, 1}
  // plus 7 pad tokens in row 1 (a 1-token document has no valid target).
  Rng rng(3);
  std::vector<std::vector<int32_t>> docs;
  for (int64_t n : {5, 1, 12, 9, 20, 7, 3}) {
    docs.emplace_back();
    for (int64_t i = 0; i < n; ++i) docs.back().push_back(int32_t(rng.below(50)));
  }
  PackingOptions opt;
  opt.seq_len = cfg.max_seq_len;
  const PackedRows rows = pack_documents(docs, opt);
  ASSERT_EQ(rows.n_rows, 2);
  const int64_t B = rows.n_rows, T = rows.seq_len;

  Transformer model(cfg, DType::F32, 11);
  PackedBatchInfo info{
      Tensor::empty({B, rows.max_segments + 1}, DType::I32),
      Tensor::empty({B, T}, DType::I32),
  };
  Tensor tokens = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
  rows.fill_batch(0, tokens, targets, info.position_ids, info.cu_seqlens);
  Activations acts(cfg, DType::F32, B, T, true);
  model.zero_grads();
  const float packed_loss = model.forward_backward(acts, tokens, targets, 1.f, &info);
  const std::vector<float> packed_grads = host(model.grads());
  EXPECT_NEAR(model.forward_loss(acts, tokens, targets, &info), packed_loss,
              1e-6 * std::fabs(packed_loss));

  int64_t N = 0;
  for (const auto& d : docs) N += int64_t(d.size()) - 1;
  model.zero_grads();
  double alone_loss = 0;
  for (const auto& d : docs) {
    const int64_t n = int64_t(d.size());
    std::vector<int32_t> tgt(d.begin() + 1, d.end());
    tgt.push_back(int32_t(Transformer::kIgnoreIndex));
    Activations a(cfg, DType::F32, 1, n, true);
    const float scale = float(n - 1) / float(N);
    alone_loss +=
        double(model.forward_backward(a, i32({1, n}, d.data()), i32({1, n}, tgt.data()), scale)) *
        double(scale);
  }
  const std::vector<float> alone_grads = host(model.grads());

  EXPECT_NEAR(packed_loss, alone_loss, 1e-5 * alone_loss);
  for (const ParamInfo& p : model.layout().params()) {
    float scale = 0, diff = 0;
    for (int64_t i = p.offset; i < p.offset + p.numel(); ++i) {
      scale = std::max(scale, std::fabs(alone_grads[size_t(i)]));
      diff = std::max(diff, std::fabs(alone_grads[size_t(i)] - packed_grads[size_t(i)]));
    }
    EXPECT_GT(scale, 0.f) << p.name << " gets no gradient";
    EXPECT_LE(diff, 1e-4f * scale)
        << p.name << ": max |packed - alone| " << diff << " of " << scale;
  }
}

TEST(PackedTransformer, GptLearnedPositionsMatchDocumentsAlone) {
  check_packed_equals_alone(tiny(false));
}

TEST(PackedTransformer, LlamaRopeMatchesDocumentsAlone) {
  check_packed_equals_alone(tiny(true));
}

// Without boundaries the same batch mixes documents: the check above is not
// vacuous.
TEST(PackedTransformer, BoundariesChangeTheLoss) {
  const ModelConfig cfg = tiny(true);
  std::vector<std::vector<int32_t>> docs = {{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10}};
  PackingOptions opt;
  opt.seq_len = 10;
  const PackedRows rows = pack_documents(docs, opt);
  Transformer model(cfg, DType::F32, 5);
  Activations acts(cfg, DType::F32, 1, 10, false);
  PackedBatchInfo info{Tensor::empty({1, rows.max_segments + 1}, DType::I32),
                       Tensor::empty({1, 10}, DType::I32)};
  Tensor tokens = Tensor::empty({1, 10}, DType::I32), targets = Tensor::empty({1, 10}, DType::I32);
  rows.fill_batch(0, tokens, targets, info.position_ids, info.cu_seqlens);
  const float packed = model.forward_loss(acts, tokens, targets, &info);
  const float mixed = model.forward_loss(acts, tokens, targets);
  EXPECT_GT(std::fabs(packed - mixed), 1e-4f);
}

}  // namespace
}  // namespace nk
