// A Mixture-of-Experts model (Mixtral; Qwen2-MoE and Qwen3-MoE) with block-quantised weights
// (FrozenWeights::Quantized, quant_plan_for as generate.quantize makes it):
// the experts are held in the ggml block formats and the router stays dense,
// as llama.cpp keeps ffn_gate_inp; the logits equal a dense model's on the
// dequantised weights within the error of quantising the activations (the
// dense quantised models' bound, tests/model/quantized_model_test.cc), packed
// for the VNNI tiles or not; and a one-token forward reads the blocks of the
// k routed experts of each layer only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "full_logits.h"
#include "model/arch.h"

namespace nk {
namespace {

// Rows of 256 (k-quants' block) for every matrix: 4 experts, top-2.
ModelConfig quant_mixtral() {
  ModelConfig c = model_preset("mixtral-tiny");
  c.d_model = 256;
  c.d_ff = 256;
  c.moe_d_ff = 256;
  c.init_std = 0.05;
  return c;
}

std::unique_ptr<Transformer> quantized_copy(const Transformer& src, ops::QuantType type) {
  const ModelConfig& c = src.config();
  std::vector<std::string> all;
  for (const ParamInfo& p : src.layout().params()) all.push_back(p.name);
  auto q = std::make_unique<Transformer>(c, DType::F32, 0, ParamInit::Zeros, all, kHost,
                                         FrozenWeights::Quantized, quant_plan_for(c, type));
  for (const ParamInfo& p : q->layout().params())
    q->set_param(p, src.param_f32(src.layout().find(p.name)));
  return q;
}

std::unique_ptr<Transformer> dense_copy(const Transformer& q) {
  auto d = std::make_unique<Transformer>(q.config(), DType::F32, 0, ParamInit::Zeros);
  for (const ParamInfo& p : d->layout().params())
    d->set_param(p, q.param_f32(q.layout().find(p.name)));
  d->sync_compute_params();
  return d;
}

const std::vector<int32_t> kToks = {1, 5, 9, 200, 33, 7, 7, 120, 255, 0, 64};

// Tolerance 0.12 of the logits' RMS: the dense quantised models' bound for
// the ggml types (activations rounded to 8-bit blocks, amplified by a
// random model), on 1 token (the direct kernel), 3 and 11 (the VNNI tiles
// where the build has them). Every token goes to all 4 experts (top-4):
// with top-2 the activations' rounding may move a random router's near-tie
// to another expert, a step of the model rather than an error of the
// weights (measured on a GGUF import: 0.52 of the RMS at one position).
// The sparse path is checked exactly below.
TEST(QuantizedMoe, BlockTypesAgainstDenseOnTheSameWeights) {
  ModelConfig c = quant_mixtral();
  c.num_experts_per_tok = c.num_experts;
  Transformer src(c, DType::F32, 7);
  // f16 and bf16 too: a bf16 MoE folder loads as bf16 rows below
  // avx512_bf16 (infer/model_source.h).
  for (ops::QuantType t : {ops::QuantType::Q8_0, ops::QuantType::Q4_0, ops::QuantType::Q4_K,
                           ops::QuantType::Q6_K, ops::QuantType::F16, ops::QuantType::BF16}) {
    SCOPED_TRACE(ops::quant_type_name(t));
    auto q = quantized_copy(src, t);
    EXPECT_TRUE(q->layout().find("h.0.moe.up.weight").quantized);
    EXPECT_TRUE(q->layout().find("h.1.moe.down.weight").quantized);
    EXPECT_FALSE(q->layout().find("h.0.moe.router.weight").quantized);
    auto d = dense_copy(*q);
    EXPECT_LT(q->weight_bytes(), d->weight_bytes());
    for (bool packed : {false, true}) {
      if (packed && q->pack_quant_weights() == 0) continue;  // no VNNI in this build
      double err = 0;
      for (size_t n : {size_t(1), size_t(3), kToks.size()}) {
        const std::vector<int32_t> tk(kToks.begin(), kToks.begin() + long(n));
        err =
            std::max(err, test::rel_max_diff(test::full_logits(*q, tk), test::full_logits(*d, tk)));
      }
      const double vs_src =
          test::rel_max_diff(test::full_logits(*q, kToks), test::full_logits(src, kToks));
      std::printf(
          "[mixtral %s%s] max |quantised - dense on its weights| / RMS = %.3g; vs the f32 "
          "source %.3g\n",
          ops::quant_type_name(t), packed ? " packed" : "", err, vs_src);
      EXPECT_LE(err, 0.12);
    }
  }
}

// One token through each layer reaches top_k experts. Each expert's blocks
// in turn are overwritten with 0xFF bytes (every f16 scale a NaN): the
// logits turn NaN exactly when that expert is one of its layer's k routed
// ones, so the other experts' blocks are not read (not even multiplied by
// a zero weight, which would give NaN too).
TEST(QuantizedMoe, OneTokenReadsOnlyTheRoutedExpertsBlocks) {
  const ModelConfig c = quant_mixtral();
  Transformer src(c, DType::F32, 11);
  for (bool packed : {false, true}) {
    SCOPED_TRACE(packed ? "packed" : "rows");
    auto q = quantized_copy(src, ops::QuantType::Q4_K);
    if (packed && q->pack_quant_weights() == 0) continue;
    const std::vector<int32_t> one = {42};
    const std::vector<float> clean = test::full_logits(*q, one);
    for (int64_t l = 0; l < c.n_layer; ++l) {
      int64_t read = 0;
      for (int64_t e = 0; e < c.num_experts; ++e) {
        // Expert e's rows of up (2F each) and down (C each), as bytes.
        std::vector<std::pair<ops::QuantWeight*, std::pair<int64_t, int64_t>>> spans;
        auto& up = q->quant_parts(fmt::format("h.{}.moe.up.weight", l));
        auto& down = q->quant_parts(fmt::format("h.{}.moe.down.weight", l));
        ASSERT_EQ(up.size(), 1u);
        ASSERT_EQ(down.size(), 1u);
        const int64_t F2 = 2 * c.expert_d_ff(), C = c.d_model;
        spans.push_back({&up[0], {F2 * e, F2}});
        spans.push_back({&down[0], {C * e, C}});
        std::vector<std::string> saved;
        for (auto& [w, r] : spans) {
          char* b = static_cast<char*>(w->data.raw()) + size_t(r.first) * w->row_bytes();
          const size_t n = size_t(r.second) * w->row_bytes();
          saved.emplace_back(b, n);
          std::memset(b, 0xFF, n);
        }
        const std::vector<float> poisoned = test::full_logits(*q, one);
        bool any_nan = false;
        for (float v : poisoned) any_nan |= std::isnan(v);
        if (any_nan)
          ++read;
        else
          EXPECT_EQ(poisoned, clean) << "layer " << l << " expert " << e;
        for (size_t i = 0; i < spans.size(); ++i) {
          auto& [w, r] = spans[i];
          std::memcpy(static_cast<char*>(w->data.raw()) + size_t(r.first) * w->row_bytes(),
                      saved[i].data(), saved[i].size());
        }
      }
      EXPECT_EQ(read, c.num_experts_per_tok) << "layer " << l;
    }
    EXPECT_EQ(test::full_logits(*q, one), clean);
  }
}

// Qwen2-MoE (a shared expert behind a sigmoid gate, q/k/v biases, top-k not
// renormalised) and Qwen3-MoE (q/k norms, heads of 128 over d_model 256)
// with block weights, as generate.quantize makes them: the routed and the
// shared experts in blocks, the router and the shared expert's one-row gate
// dense (llama.cpp's f32 ffn_gate_inp and 1-d ffn_gate_inp_shexp); logits
// against a dense model on the same weights within the bound above (every
// token to all experts, as above).
TEST(QuantizedMoe, QwenMoeBlockTypesAgainstDense) {
  for (const char* preset : {"qwen2-moe-tiny", "qwen3-moe-tiny"}) {
    SCOPED_TRACE(preset);
    ModelConfig c = model_preset(preset);
    c.d_model = 256;
    c.d_ff = 256;
    c.moe_d_ff = 256;
    if (c.moe_shared_d_ff > 0) c.moe_shared_d_ff = 256;
    if (c.attn_head_dim > 0) c.attn_head_dim = 128;
    c.num_experts_per_tok = c.num_experts;
    c.init_std = 0.05;
    Transformer src(c, DType::F32, 9);
    for (ops::QuantType t : {ops::QuantType::Q8_0, ops::QuantType::Q4_K}) {
      SCOPED_TRACE(ops::quant_type_name(t));
      auto q = quantized_copy(src, t);
      EXPECT_TRUE(q->layout().find("h.1.moe.up.weight").quantized);
      EXPECT_FALSE(q->layout().find("h.1.moe.router.weight").quantized);
      if (c.moe_shared_d_ff > 0) {
        EXPECT_TRUE(q->layout().find("h.1.moe.shared_up.weight").quantized);
        EXPECT_TRUE(q->layout().find("h.1.moe.shared_down.weight").quantized);
        EXPECT_FALSE(q->layout().find("h.1.moe.shared_gate.weight").quantized);
      }
      auto d = dense_copy(*q);
      double err = 0;
      for (size_t n : {size_t(1), size_t(3), kToks.size()}) {
        const std::vector<int32_t> tk(kToks.begin(), kToks.begin() + long(n));
        err =
            std::max(err, test::rel_max_diff(test::full_logits(*q, tk), test::full_logits(*d, tk)));
      }
      std::printf("[%s %s] max |quantised - dense on its weights| / RMS = %.3g\n", preset,
                  ops::quant_type_name(t), err);
      EXPECT_LE(err, 0.12);
    }
  }
}

}  // namespace
}  // namespace nk
