// The reference of an adapter policy without a second copy: with its adapters
// switched off (Transformer::set_adapters_enabled) a LoRA or IA3 model's
// sequence log-probabilities equal its base model's bit for bit, in f32 and
// in bf16 with the base held in bf16 alone; with them on they differ.
#include <gtest/gtest.h>

#include <cstring>

#include "align/reference.h"
#include "core/rng.h"
#include "model/peft.h"
#include "model/tiny_config.h"
#include "tensor_util.h"

namespace nk {
namespace {

struct Case {
  std::string name;
  bool ia3;
  DType dtype;
};

class AdapterOff : public ::testing::TestWithParam<Case> {};

TEST_P(AdapterOff, EqualsTheBaseBitForBit) {
  const Case& k = GetParam();
  const int64_t B = 4, T = 16;
  ModelConfig base_cfg = test::three_layer_config(true, false);
  ModelConfig cfg = base_cfg;
  if (k.ia3) {
    cfg.ia3 = default_ia3(cfg);
  } else {
    cfg.lora.rank = 4;
    cfg.lora.alpha = 8;
    cfg.lora.target_modules = {"all-linear"};
  }
  std::vector<std::string> frozen;
  const ParamLayout layout = Transformer::layout_for(cfg);
  for (const ParamInfo& p : layout.params())
    if (!p.adapter) frozen.push_back(p.name);
  const FrozenWeights fw = k.dtype == DType::BF16 ? FrozenWeights::Compute : FrozenWeights::Master;
  Transformer policy(cfg, k.dtype, 5, ParamInit::Random, frozen, kHost, fw);
  // Adapters that change the output (LoRA's B starts at zero, IA3's at one).
  Rng rng(3);
  for (const ParamInfo& p : policy.layout().params()) {
    if (!p.adapter) continue;
    std::vector<float> v(size_t(p.numel()));
    for (float& x : v) x = (k.ia3 ? 1.f : 0.f) + 0.5f * (float(rng.uniform()) - 0.5f);
    Tensor t = Tensor::empty(p.shape, DType::F32);
    ops::copy_from_host(t, v.data());
    policy.set_param(p, t);
  }
  Transformer base(base_cfg, k.dtype, 9);
  for (const ParamInfo& p : base.layout().params())
    base.set_param(p, policy.param_f32(policy.layout().find(p.name)));

  Tensor tokens = test::random_ids({B, T}, cfg.vocab_size, 1);
  std::vector<int32_t> tg = test::random_id_list(B * T, cfg.vocab_size, 2);
  for (int64_t i = 0; i < B * T; i += 3) tg[size_t(i)] = -100;
  Tensor targets = test::i32_tensor({B, T}, tg);
  std::vector<double> want(B), off(B), on(B);
  Activations ab(base, B, T, false), ap(policy, B, T, true);
  sequence_logps(base, ab, tokens, targets, want);
  policy.set_adapters_enabled(false);
  sequence_logps(policy, ap, tokens, targets, off);
  policy.set_adapters_enabled(true);
  sequence_logps(policy, ap, tokens, targets, on);
  EXPECT_EQ(std::memcmp(want.data(), off.data(), sizeof(double) * B), 0)
      << want[0] << " vs " << off[0];
  for (int64_t b = 0; b < B; ++b) EXPECT_NE(want[size_t(b)], on[size_t(b)]) << "row " << b;
}

INSTANTIATE_TEST_SUITE_P(Policies, AdapterOff,
                         ::testing::Values(Case{"lora_f32", false, DType::F32},
                                           Case{"lora_bf16", false, DType::BF16},
                                           Case{"ia3_f32", true, DType::F32},
                                           Case{"ia3_bf16", true, DType::BF16}),
                         [](const auto& info) { return info.param.name; });

// A backward with the adapters off is refused (the reference is forward only).
TEST(AdapterOffBackward, IsRefused) {
  ModelConfig cfg = test::three_layer_config(true, true);
  std::vector<std::string> frozen;
  const ParamLayout layout = Transformer::layout_for(cfg);
  for (const ParamInfo& p : layout.params())
    if (!p.adapter) frozen.push_back(p.name);
  Transformer m(cfg, DType::F32, 1, ParamInit::Random, frozen);
  Activations a(m, 2, 8, true);
  Tensor tokens = test::random_ids({2, 8}, cfg.vocab_size, 1);
  m.set_adapters_enabled(false);
  EXPECT_THROW(m.forward_backward(a, tokens, tokens, 1.f), InternalError);
}

}  // namespace
}  // namespace nk
