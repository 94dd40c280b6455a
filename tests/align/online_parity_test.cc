// GRPO's, RLOO's and PPO's losses and gradients against an independent float64
// PyTorch reference (tests/align/online_reference.py, from the published
// formulas): a tiny Llama and a tiny GPT-2, fixed rollouts (2 prompts x 4
// generations of random tokens with random rewards) through OnlineObjective
// (the path `nekton align align.method=grpo` runs) with align.ppo_epochs = 5,
// so the 5 AdamW steps reuse the round: the ratios move off 1 and clip, the
// old log-probabilities are the round's; a reference model other than the
// policy (a frozen copy of another initialisation) makes the KL terms live.
// PPO's policies carry a value head, or a critic of their own (a reward
// model of another initialisation, trained with them): its values, GAE,
// whitening and the clipped value loss are in the reference too, and the
// critic's final weights.
// Every step's loss and every final weight within 1e-4 relative.
#include <gtest/gtest.h>

#include <filesystem>

#include "align/objective_steps.h"
#include "align/online_objective.h"
#include "ckpt/model_io.h"
#include "ckpt/safetensors.h"
#include "core/atomic_file.h"
#include "core/rng.h"
#include "data/tokenizer/tokenizer.h"
#include "model/parity_steps.h"
#include "model/tiny_config.h"
#include "tensor_util.h"
#include "test_paths.h"
#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;

struct Case {
  std::string name, algorithm = "grpo", loss_type = "grpo", scale_rewards = "group";
  double kl_coef = 0, epsilon = 0.2, epsilon_high = 0, temperature = 1.0;
  // PPO's
  double gamma = 1, lam = 0.95, cliprange_value = 0.2, vf_coef = 0.1;
  bool whiten_rewards = false;
  bool critic = false;   // PPO: a separate critic (align.value_model) instead of a value head
  double critic_lr = 0;  // align.critic_lr (0: the policy's rate)
};

void run_parity(ModelConfig mc, const Case& k, const std::string& tag) {
  mc.value_head = k.algorithm == "ppo" && !k.critic;
  const int64_t P = 2, G = 4, B = P * G, T = 16, max_tokens = 10;
  const fs::path dir = fs::path(NK_BINARY_DIR) / "align_parity" / (tag + "_" + k.name);
  TrainConfig cfg = test::parity_train_config(mc, B, T, dir);
  RejectionSamplingOptions rs;
  rs.num_rollouts = G;
  rs.max_tokens = max_tokens;
  rs.sampling.temperature = k.temperature;
  OnlineRlConfig rl;
  rl.scale_rewards = k.scale_rewards;
  rl.epsilon = k.epsilon;
  rl.epsilon_high = k.epsilon_high;
  rl.kl_coef = k.kl_coef;
  rl.ppo_epochs = 5;
  rl.loss.gamma = k.gamma;
  rl.loss.lam = k.lam;
  rl.loss.cliprange_value = k.cliprange_value;
  rl.loss.vf_coef = k.vf_coef;
  rl.loss.whiten_rewards = k.whiten_rewards;
  if (k.critic) rl.value_model = (dir / "critic").string();
  rl.critic_lr = k.critic_lr;
  cfg.lr.lr = test::objective_parity_steps().lr;  // the rate the steps take
  rl.check(k.algorithm, k.loss_type, rs, B, T, 6);

  // Fixed rollouts: each group's prompt (3-5 tokens), completions of 2-10
  // tokens, rewards with ties (a group of equal rewards has advantages 0).
  auto round = std::make_shared<RolloutRound>();
  round->index = 0;
  Rng rng(7);
  std::vector<float> rewards;
  for (int64_t p = 0; p < P; ++p) {
    std::vector<int32_t> prompt;
    for (int64_t t = 0; t < 3 + 2 * p; ++t) prompt.push_back(int32_t(rng.below(mc.vocab_size)));
    for (int64_t g = 0; g < G; ++g) {
      Rollout r;
      r.prompt = p;
      r.tokens = prompt;
      r.prompt_len = int64_t(prompt.size());
      const int64_t n = 2 + int64_t(rng.below(max_tokens - 1));
      for (int64_t t = 0; t < n; ++t) r.tokens.push_back(int32_t(rng.below(mc.vocab_size)));
      r.reward = double(int64_t(rng.below(4))) * 0.5;
      rewards.push_back(float(r.reward));
      round->samples.push_back(std::move(r));
    }
  }
  auto prompts = std::make_shared<OnlinePrompts>();
  prompts->records.file.path = "fixed";
  prompts->tokens.resize(size_t(P));
  auto tok = load_tokenizer("bytes");
  // The reference: the seed's initialisation; the policy another one.
  Transformer model(mc, DType::F32, cfg.seed + 1);
  save_model((dir / "model").string(), model);
  {
    Transformer ref(mc, DType::F32, cfg.seed);
    save_model((dir / "ref").string(), ref);
  }
  OnlineObjective obj(cfg, rl, prompts, std::shared_ptr<Tokenizer>(std::move(tok)), {},
                      OnlineScorer{}, ReferenceSource::Copy);
  Transformer* critic = nullptr;
  if (k.critic) {  // a reward model of another initialisation, at the steps' settings
    ModelConfig cc = mc;
    cc.num_labels = 1;
    Transformer start(cc, DType::F32, cfg.seed + 2);
    save_model((dir / "critic").string(), start);
    TrainConfig critic_run = cfg;
    critic_run.adamw = test::objective_parity_steps().adamw;
    auto c = std::make_unique<Critic>(critic_run, (dir / "critic").string(), mc.vocab_size);
    critic = &c->model();
    obj.set_critic(std::move(c));
  }
  obj.prepare(model, true);
  obj.set_round(model, round);

  Tensor tokens = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
  for (int64_t b = 0; b < B; ++b)
    rollout_row(round->samples[size_t(b)], T, 0, tokens.data<int32_t>() + b * T,
                targets.data<int32_t>() + b * T);
  save_safetensors(
      (dir / "batch.safetensors").string(),
      {{"tokens", tokens}, {"targets", targets}, {"rewards", test::f32_tensor(rewards)}});
  write_file_atomic(
      (dir / "settings.json").string(),
      fmt::format(R"({{"algorithm": "{}", "loss_type": "{}", "scale_rewards": "{}",
 "G": {}, "kl_coef": {}, "epsilon_low": {}, "epsilon_high": {}, "temperature": {},
 "max_tokens": {}, "gamma": {}, "lam": {}, "cliprange_value": {}, "vf_coef": {},
 "whiten_rewards": {}}})",
                  k.algorithm, rl_loss_type_name(rl.loss.loss_type), k.scale_rewards, G, k.kl_coef,
                  rl.loss.epsilon_low, rl.loss.epsilon_high, k.temperature, max_tokens, k.gamma,
                  k.lam, k.cliprange_value, k.vf_coef, k.whiten_rewards));
  test::run_objective_steps(obj, model, tokens, targets, dir, critic,
                            k.critic_lr > 0 ? k.critic_lr / cfg.lr.lr : 1.0);
  test::expect_python_reference_passes("align/online_reference.py", dir, tag + " " + k.name);
}

std::vector<Case> cases() {
  return {
      {.name = "grpo", .kl_coef = 0.04},
      {.name = "grpo_no_kl_batch_scale", .scale_rewards = "batch"},
      {.name = "dr_grpo", .loss_type = "dr_grpo", .scale_rewards = "none", .kl_coef = 0.1},
      {.name = "dapo_clip_higher_temp",
       .loss_type = "dapo",
       .epsilon = 0.1,
       .epsilon_high = 0.28,
       .temperature = 0.7},
      {.name = "rloo_kl", .algorithm = "rloo", .kl_coef = 0.05, .epsilon = 0.1},
      // PPO: TRL's defaults (token-level mean), then GAE with discounting,
      // whitened rewards, a tight value clip and a heavier value loss.
      {.name = "ppo_kl", .algorithm = "ppo", .loss_type = "sigmoid", .kl_coef = 0.05},
      {.name = "ppo_gae_whiten_vclip",
       .algorithm = "ppo",
       .kl_coef = 0.1,
       .epsilon = 0.1,
       .temperature = 0.8,
       .gamma = 0.9,
       .lam = 0.8,
       .cliprange_value = 0.02,
       .vf_coef = 0.5,
       .whiten_rewards = true},
      // PPO with a critic of its own: its values, and its weights under the
      // policy's clipping and AdamW settings.
      {.name = "ppo_critic",
       .algorithm = "ppo",
       .loss_type = "sigmoid",
       .kl_coef = 0.05,
       .critic = true},
      {.name = "ppo_critic_gae_vclip",
       .algorithm = "ppo",
       .kl_coef = 0.1,
       .gamma = 0.9,
       .lam = 0.8,
       .cliprange_value = 0.05,
       .vf_coef = 0.5,
       .whiten_rewards = true,
       .critic = true},
      // The critic at its own rate (align.critic_lr, 5x the policy's).
      {.name = "ppo_critic_lr",
       .algorithm = "ppo",
       .loss_type = "sigmoid",
       .kl_coef = 0.05,
       .critic = true,
       .critic_lr = 5e-2},
  };
}

class OnlineParity : public ::testing::TestWithParam<Case> {};

TEST_P(OnlineParity, TinyLlama) {
  ModelConfig c = test::tiny_config(true, 257, 32);  // the bytes tokenizer pads with 256
  c.init_std = 0.05;
  run_parity(c, GetParam(), "online_llama");
}

TEST_P(OnlineParity, TinyGpt2) {
  ModelConfig c = test::tiny_config(false, 257, 32);
  c.init_std = 0.05;
  run_parity(c, GetParam(), "online_gpt2");
}

INSTANTIATE_TEST_SUITE_P(Losses, OnlineParity, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace nk
