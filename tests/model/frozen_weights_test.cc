// How a frozen base is held (model/transformer.h FrozenWeights), against the
// plain model with f32 masters for every weight:
//  - Compute (bf16 copy alone): the same bf16 weights, so the same step bit
//    for bit, in a third of the weight memory;
//  - Nf4 (QLoRA's base): the model equals a plain f32 model holding the
//    dequantised NF4 weights, to 1e-5 relative (the fused products sum over
//    panels of the weight, the plain ones in one product: fp32 rounding
//    only, ~1e-7 per sum over these widths);
//  - which parameters NF4 takes, what set_param / param_f32 read back, and
//    that an NF4 base refuses to be saved as a model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ckpt/model_io.h"
#include "core/rng.h"
#include "model/peft.h"
#include "model/tiny_config.h"
#include "tensor_util.h"
#include "test_util.h"

namespace nk {
namespace {

using test::i32_tensor;

using test::host;
using test::rel_err;

// A tiny model with LoRA on every linear layer (B nonzero so it matters).
ModelConfig adapted(bool llama) {
  ModelConfig c = test::tiny_config(llama, 97, 32);
  c.init_std = 0.05;
  c.lora.rank = 4;
  c.lora.alpha = 8;
  c.lora.target_modules = {"all-linear"};
  return c;
}

std::vector<std::string> base_names(const ModelConfig& c) {
  std::vector<std::string> out;
  const ParamLayout layout = Transformer::layout_for(c);
  for (const ParamInfo& p : layout.params())
    if (!p.adapter) out.push_back(p.name);
  return out;
}

std::unique_ptr<Transformer> model(const ModelConfig& c, DType dt, FrozenWeights f) {
  auto m = std::make_unique<Transformer>(c, dt, 3, ParamInit::Random, base_names(c), kHost, f);
  // LoRA's B starts at zero; give it values so the adapters matter.
  Rng rng(9);
  for (const AdaptedModule& t : lora_targets(c)) {
    const ParamInfo& p = m->layout().find(t.b_name());
    std::vector<float> v(size_t(p.numel()));
    for (float& x : v) x = float(rng.normal() * 0.1);
    Tensor w = Tensor::empty(p.shape, DType::F32);
    ops::copy_from_host(w, v.data());
    m->set_param(p, w);
  }
  return m;
}

struct Step {
  float loss;
  std::vector<float> grads, logits;
};

Step step(Transformer& m) {
  const int64_t B = 2, T = 16, V = m.config().vocab_size;
  Rng rng(7);
  std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
  for (auto& t : tok) t = int32_t(rng.below(uint64_t(V)));
  for (auto& t : tgt) t = int32_t(rng.below(uint64_t(V)));
  Tensor tokens = i32_tensor({B, T}, tok), targets = i32_tensor({B, T}, tgt);
  Step s;
  {
    Activations a(m, B, T, true);
    m.zero_grads();
    s.loss = m.forward_backward(a, tokens, targets, 1.f);
    s.grads = host(m.grads());
  }
  Activations a(m, B, T, false);
  Tensor logits = Tensor::empty({B * T, V}, DType::F32);
  m.forward_all_logits(a, tokens, logits);
  s.logits = host(logits);
  return s;
}

TEST(FrozenWeights, Bf16CopyAloneGivesTheSameStep) {
  for (bool llama : {true, false}) {
    const ModelConfig c = adapted(llama);
    auto full = model(c, DType::BF16, FrozenWeights::Master);
    auto lean = model(c, DType::BF16, FrozenWeights::Compute);
    const ParamLayout& l = lean->layout();
    EXPECT_EQ(lean->params().numel(), l.trainable_end());  // masters: the adapters only
    EXPECT_EQ(lean->compute_params().numel(), l.total());
    // 4 bytes per trainable parameter and 2 per parameter, against 4 + 2 for all.
    EXPECT_EQ(lean->weight_bytes(), size_t(4 * l.trainable_end() + 2 * l.total()));
    EXPECT_EQ(full->weight_bytes(), size_t(6 * full->layout().total()));
    // A frozen weight reads back as its bf16 rounding.
    const ParamInfo& w = l.find("h.1.mlp.down.weight");
    EXPECT_FALSE(lean->has_master(w));
    Tensor want = Tensor::empty(w.shape, DType::BF16);
    ops::convert(want, full->param_f32(full->layout().find(w.name)));
    EXPECT_EQ(host(lean->param_f32(w)), host(want));

    const Step a = step(*full), b = step(*lean);
    EXPECT_EQ(a.loss, b.loss) << llama;
    EXPECT_EQ(a.grads, b.grads) << llama;
    EXPECT_EQ(a.logits, b.logits) << llama;
  }
}

TEST(FrozenWeights, Nf4BaseIsItsDequantisedWeights) {
  for (bool llama : {true, false}) {
    const ModelConfig c = adapted(llama);
    auto q = model(c, DType::F32, FrozenWeights::Nf4);
    auto plain = model(c, DType::F32, FrozenWeights::Master);
    // Every weight matrix of the base in NF4 (GPT-2's tied table too), the
    // learned positions, norms, biases and adapters not.
    std::vector<std::string> quantized;
    for (const ParamInfo& p : q->layout().params()) {
      if (p.quantized) quantized.push_back(p.name);
      EXPECT_EQ(p.quantized, !p.adapter && p.shape.size() == 2 && p.name != "wpe") << p.name;
      plain->set_param(plain->layout().find(p.name), q->param_f32(p));
    }
    EXPECT_EQ(quantized.size(), size_t(llama ? 10 : 9));
    // f32 for the dense ones; per quantised one half a byte a value, a byte a
    // block of 64, an f32 scale per 256 blocks and the offset.
    size_t want = size_t(4 * q->layout().dense_end());
    for (const std::string& name : quantized) {
      const int64_t n = q->layout().find(name).numel(), blocks = (n + 63) / 64;
      want += size_t((n + 1) / 2 + blocks + 4 * ((blocks + 255) / 256) + 4);
    }
    EXPECT_EQ(q->weight_bytes(), want);

    const Step a = step(*plain), b = step(*q);
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::abs(a.loss)) << llama;
    EXPECT_LE(rel_err(b.grads, a.grads), 1e-5) << llama;
    EXPECT_LE(rel_err(b.logits, a.logits), 1e-5) << llama;

    // The NF4 values differ from the random f32 ones they came from, but
    // within NF4's error (levels 0.08-0.3 apart times each block's absmax).
    auto orig = model(c, DType::F32, FrozenWeights::Master);
    const std::string w = "h.0.attn.qkv.weight";
    const double err = rel_err(host(q->param_f32(q->layout().find(w))),
                               host(orig->param_f32(orig->layout().find(w))));
    EXPECT_GT(err, 1e-3);
    EXPECT_LT(err, 0.2);
  }
}

// QLoRA on Mixture-of-Experts models: every frozen weight matrix in NF4 but
// the routers and the shared expert's gate (kept dense, as unsloth and the
// GPTQ MoE checkpoints keep them); each expert's rows of the stacked up and
// down quantised on their own (bitsandbytes quantises each expert's
// nn.Linear: no block or absmax group across experts); the model equals
// a plain f32 one holding the dequantised weights, to 1e-5 as above.
TEST(FrozenWeights, Nf4MoeQuantisesEachExpertOnItsOwn) {
  for (const char* preset : {"mixtral-tiny", "qwen2-moe-tiny"}) {
    SCOPED_TRACE(preset);
    ModelConfig c = model_preset(preset);
    c.init_std = 0.05;
    c.lora.rank = 4;
    c.lora.alpha = 8;
    c.lora.target_modules = {"all-linear"};  // the experts and the shared expert, not the routers
    auto q = model(c, DType::F32, FrozenWeights::Nf4);
    auto plain = model(c, DType::F32, FrozenWeights::Master);
    auto orig = model(c, DType::F32, FrozenWeights::Master);  // the values q quantised
    size_t want = size_t(4 * q->layout().dense_end());
    int experts = 0;
    for (const ParamInfo& p : q->layout().params()) {
      const bool gate =
          p.name.ends_with(".moe.router.weight") || p.name.ends_with(".moe.shared_gate.weight");
      EXPECT_EQ(p.quantized, !p.adapter && p.shape.size() == 2 && !gate) << p.name;
      plain->set_param(plain->layout().find(p.name), q->param_f32(p));
      if (!p.quantized) continue;
      const bool stacked = p.split == Split::Experts;
      const int64_t runs = stacked ? c.num_experts : 1, rows = p.shape[0] / runs;
      for (int64_t e = 0; e < runs; ++e) {
        const int64_t n = rows * p.shape[1], blocks = (n + 63) / 64;
        want += size_t((n + 1) / 2 + blocks + 4 * ((blocks + 255) / 256) + 4);
      }
      if (!stacked) continue;
      ++experts;
      // Expert e's rows: its own f32 rows through NF4 and back, bit for bit.
      const std::vector<float> got = host(q->param_f32(p));
      const Tensor o = orig->param_f32(orig->layout().find(p.name));
      for (int64_t e = 0; e < runs; ++e) {
        Tensor mine = Tensor::empty({rows, p.shape[1]}, DType::F32);
        ops::convert(mine, o.narrow0(e * rows, rows));
        ops::Nf4Weight w = ops::Nf4Weight::empty(mine.shape());
        ops::nf4_quantize(w, mine);
        Tensor back = Tensor::empty(mine.shape(), DType::F32);
        ops::nf4_dequantize(back, w);
        const std::vector<float> b = host(back);
        EXPECT_TRUE(std::equal(b.begin(), b.end(), got.begin() + e * rows * p.shape[1]))
            << p.name << " expert " << e;
      }
      // Quantised whole, the stacked tensor reads back otherwise (its absmax
      // offset and scale groups span the experts).
      ops::Nf4Weight whole = ops::Nf4Weight::empty(p.shape);
      ops::nf4_quantize(whole, o);
      Tensor back = Tensor::empty(p.shape, DType::F32);
      ops::nf4_dequantize(back, whole);
      EXPECT_NE(host(back), got) << p.name;
    }
    EXPECT_EQ(experts, 2 * c.n_layer);
    EXPECT_EQ(q->weight_bytes(), want);

    const Step a = step(*plain), b = step(*q);
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::abs(a.loss));
    EXPECT_LE(rel_err(b.grads, a.grads), 1e-5);
    EXPECT_LE(rel_err(b.logits, a.logits), 1e-5);
  }
}

TEST(FrozenWeights, Nf4BaseIsNotSavedAsAModel) {
  test::TempDir d("nk_frozen");
  auto q = model(adapted(true), DType::F32, FrozenWeights::Nf4);
  try {
    save_model(d / "m", *q);
    FAIL() << "saved";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "is held in NF4 (QLoRA), which is not saved")) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(d / "m"));
}

}  // namespace
}  // namespace nk
