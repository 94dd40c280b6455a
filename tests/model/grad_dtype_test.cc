// bf16 gradients (Transformer::set_grad_dtype, optim.grad_dtype=bf16): each
// backward stage computes its gradients in f32 exactly as the f32 arena
// would get them, and adds them into the bf16 arena rounded once. So, for
// every parameter one stage writes, the bf16 gradient of one micro-batch is
// the f32 gradient rounded to nearest even, bit for bit, and two micro-batches
// give round(round(g1) + g2); GPT-2's tied embedding, written by the head and
// by the embedding stage, is rounded twice. GPT-2 and Llama, with LoRA
// adapters and without.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/tiny_config.h"
#include "model/transformer.h"
#include "tensor_util.h"
#include "test_util.h"

namespace nk {
namespace {

using test::host;
using test::random_ids;

// Round to nearest even, written out (finite values).
float bf16_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

ModelConfig config(bool llama, bool lora) {
  return test::three_layer_config(llama, lora);
}

constexpr int64_t B = 2, T = 12;

// The gradients of the micro-batches `mbs` accumulated (bf16 compute), in
// `grads` dtype; `head_only`: of the head stage alone, for the first one.
std::vector<float> gradients(const ModelConfig& c, DType grads, const std::vector<uint64_t>& mbs,
                             bool head_only = false) {
  Transformer m(c, DType::BF16, 5);
  if (grads != DType::F32) m.set_grad_dtype(grads);
  EXPECT_EQ(m.grads().dtype(), grads);
  Activations a(m, B, T, true);
  m.zero_grads();
  for (uint64_t mb : mbs) {
    const Tensor tokens = random_ids({B, T}, c.vocab_size, 1 + mb);
    const Tensor targets = random_ids({B, T}, c.vocab_size, 11 + mb);
    if (head_only) {
      m.embed_forward(a, tokens);
      m.blocks_forward(a, 0, c.n_layer);
      m.head_loss(a, targets, true, 0.5f);
      break;
    }
    m.forward_backward(a, tokens, targets, 0.5f);
  }
  return host(m.grads());
}

template <class Check>
void for_each_model(Check&& check) {
  for (bool llama : {false, true})
    for (bool lora : {false, true}) {
      SCOPED_TRACE(std::string(llama ? "llama" : "gpt2") + (lora ? " + LoRA" : ""));
      const ModelConfig c = config(llama, lora);
      check(c, Transformer(c, DType::BF16, 5).layout());
    }
}

TEST(GradDtype, OneMicroBatchIsTheF32GradientRoundedOnce) {
  for_each_model([](const ModelConfig& c, const ParamLayout& layout) {
    const std::vector<float> f32 = gradients(c, DType::F32, {0});
    const std::vector<float> bf16 = gradients(c, DType::BF16, {0});
    const std::vector<float> head = gradients(c, DType::F32, {0}, true);
    ASSERT_EQ(f32.size(), bf16.size());
    int64_t live = 0;
    for (const ParamInfo& p : layout.params()) {
      if (!p.trainable) continue;
      const bool twice = p.name == "wte" && c.tied_embeddings;
      for (int64_t i = p.offset; i < p.offset + p.numel(); ++i) {
        const float g = f32[size_t(i)], got = bf16[size_t(i)];
        live += g != 0.f;
        if (twice) {  // round(round(head) + embedding): within two roundings
          const double bound = std::ldexp(std::fabs(g) + std::fabs(head[size_t(i)]), -8);
          ASSERT_LE(std::fabs(double(got) - double(g)), bound)
              << p.name << "[" << i - p.offset << "]";
        } else {
          ASSERT_EQ(got, bf16_round(g)) << p.name << "[" << i - p.offset << "]: f32 " << g;
        }
      }
    }
    EXPECT_GT(live, int64_t(f32.size()) / 2) << "most gradients are live";
  });
}

TEST(GradDtype, TwoMicroBatchesRoundTheSumOnce) {
  for_each_model([](const ModelConfig& c, const ParamLayout& layout) {
    const std::vector<float> g1 = gradients(c, DType::F32, {0});
    const std::vector<float> g2 = gradients(c, DType::F32, {1});
    const std::vector<float> both = gradients(c, DType::BF16, {0, 1});
    for (const ParamInfo& p : layout.params()) {
      if (!p.trainable || (p.name == "wte" && c.tied_embeddings)) continue;
      for (int64_t i = p.offset; i < p.offset + p.numel(); ++i) {
        const float want = bf16_round(bf16_round(g1[size_t(i)]) + g2[size_t(i)]);
        ASSERT_EQ(both[size_t(i)], want) << p.name << "[" << i - p.offset << "]";
      }
    }
  });
}

// The arena is 2 bytes per trainable parameter, the f32 staging the size of
// the largest backward stage; F32 goes back to the f32 arena.
TEST(GradDtype, ArenaAndStagingSizes) {
  const ModelConfig c = config(true, false);
  Transformer m(c, DType::BF16, 5);
  const int64_t n = m.layout().trainable_end();
  EXPECT_EQ(m.grad_bytes(), size_t(4 * n));
  m.set_grad_dtype(DType::BF16);
  const GradStaging plan = plan_grad_staging(c, m.layout());
  // The stages: each layer's parameters, the untied head with the final
  // norm, the embedding; every trainable parameter in exactly one.
  int64_t layer = 0;
  for (const ParamInfo& p : m.layout().params())
    if (p.name.starts_with("h.0.")) layer += p.numel();
  const int64_t head = c.vocab_size * c.d_model + c.d_model, embed = c.vocab_size * c.d_model;
  EXPECT_EQ(plan.elems, std::max({layer, head, embed}));
  ASSERT_EQ(plan.units.size(), size_t(c.n_layer + 2));
  int64_t placed = 0;
  for (const auto& unit : plan.units)
    for (const GradStaging::Span& s : unit) placed += s.n;
  EXPECT_EQ(placed, n);
  EXPECT_EQ(m.grad_bytes(), size_t(2 * n + 4 * plan.elems));
  m.set_grad_dtype(DType::F32);
  EXPECT_EQ(m.grad_bytes(), size_t(4 * n));
}

}  // namespace
}  // namespace nk
