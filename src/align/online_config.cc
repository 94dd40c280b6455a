#include "align/online_config.h"

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace nk {

void OnlineRlConfig::bind(ConfigBinder& b) {
  b.alias("align.num_generations", "align.num_rollouts_per_prompt");
  b.alias("align.max_completion_length", "align.max_tokens");
  b.bind("align.scale_rewards", scale_rewards,
         "grpo: divide each group's centred rewards by the group's standard deviation (group; "
         "GRPO), the round's (batch) or not at all (none; Dr. GRPO) (TRL scale_rewards)");
  b.bind("align.epsilon", epsilon,
         "grpo, rloo: the ratio's lower clip, 1 - epsilon (and the upper without "
         "align.epsilon_high; TRL epsilon)");
  b.bind("align.epsilon_high", epsilon_high,
         "grpo, rloo: the ratio's upper clip, 1 + epsilon_high (DAPO's clip-higher, 0.28 "
         "there; 0 = align.epsilon)");
  b.bind("align.kl_coef", kl_coef,
         "grpo: beta of the k3 KL to the reference in the loss (TRL GRPO beta; 0 = no "
         "reference model at all); rloo: of the KL penalty subtracted from the reward");
  b.alias("align.cliprange", "align.epsilon");
  b.bind("align.gamma", loss.gamma, "ppo: GAE's discount per token (TRL gamma)");
  b.bind("align.lam", loss.lam, "ppo: GAE's lambda (TRL lam)");
  b.bind("align.cliprange_value", loss.cliprange_value,
         "ppo: the value head's prediction clipped to the round's value +- this in the value "
         "loss (TRL cliprange_value)");
  b.bind("align.vf_coef", loss.vf_coef, "ppo: the value loss's weight (TRL vf_coef)");
  b.bind("align.whiten_rewards", loss.whiten_rewards,
         "ppo: whiten the per-token rewards over the round, keeping their mean (TRL "
         "whiten_rewards)");
  b.bind("align.rollout_prompts", rollout_prompts,
         "grpo, rloo: prompts per round of generation (0 = train.global_batch / "
         "num_generations); the round's completions make rollout_prompts x num_generations / "
         "train.global_batch optimizer steps per epoch (TRL steps_per_generation)");
  b.bind("align.ppo_epochs", ppo_epochs,
         "grpo, rloo: passes over each round's completions (TRL num_iterations; old "
         "log-probabilities then come from the round's policy)");
  b.bind("align.mask_truncated_completions", mask_truncated,
         "grpo, rloo: completions cut by align.max_tokens add nothing to the loss (DAPO; TRL "
         "mask_truncated_completions)");
  b.bind("align.dynamic_sampling", dynamic_sampling,
         "grpo: drop groups whose rewards are all equal and generate more (DAPO's dynamic "
         "sampling), up to align.dynamic_sampling_max_batches batches of prompts per round");
  b.bind("align.dynamic_sampling_max_batches", dynamic_sampling_max_batches,
         "grpo: batches of align.rollout_prompts prompts a round may generate to fill itself "
         "with groups of unequal rewards (then it trains on what it has)");
  b.bind("align.log_completions_every", log_completions_every,
         "grpo, rloo: every N rounds append the round's prompts, completions and rewards to "
         "OUT_DIR/completions.jsonl (0 = never)");
  b.bind("align.value_model", value_model,
         "ppo: a critic of its own, started from this model folder (a reward model: its score "
         "head read at every token, TRL's value_model; or a causal LM given a score head), "
         "trained with the policy and saved to OUT_DIR/critic; empty: a value head on the "
         "policy's trunk");
  b.bind("align.critic_lr", critic_lr,
         "ppo with align.value_model: the critic's peak learning rate, its schedule train.lr's "
         "scaled by critic_lr / train.lr (OpenRLHF's critic_learning_rate, NeMo-Aligner's "
         "critic optim.lr); 0 = the policy's, as TRL's one optimizer");
  b.bind("align.kv_cache_mb", kv_cache_mb,
         "grpo, rloo: the rollout generator's paged KV cache, MiB (0 = room for "
         "align.rollout_batch_size whole sequences); freed after each round");
}

void OnlineRlConfig::check(const std::string& method, const std::string& loss_type,
                           const RejectionSamplingOptions& rs, int64_t global_batch,
                           int64_t seq_len, int64_t max_prompt_length) {
  sampling = rs;
  loss.algorithm = method == "rloo"  ? RlAlgorithm::Rloo
                   : method == "ppo" ? RlAlgorithm::Ppo
                                     : RlAlgorithm::Grpo;
  const bool ppo = loss.algorithm == RlAlgorithm::Ppo;
  // PPO's default aggregation is TRL's masked mean over the step's tokens.
  loss.loss_type = parse_rl_loss_type(loss_type == "sigmoid" ? (ppo ? "dapo" : "grpo") : loss_type,
                                      "align.loss_type");
  loss.scale_rewards = parse_reward_scaling(scale_rewards, "align.scale_rewards");
  if (loss.algorithm != RlAlgorithm::Grpo && scale_rewards != "group")
    fail(
        "align.scale_rewards: GRPO's; RLOO's advantages are leave-one-out differences, PPO's "
        "are GAE's, whitened over the round");
  if (!(loss.gamma >= 0 && loss.gamma <= 1))
    fail("align.gamma: must be in [0, 1], got {}", loss.gamma);
  if (!(loss.lam >= 0 && loss.lam <= 1)) fail("align.lam: must be in [0, 1], got {}", loss.lam);
  if (!(loss.cliprange_value > 0) || !std::isfinite(loss.cliprange_value))
    fail("align.cliprange_value: must be > 0, got {}", loss.cliprange_value);
  if (!(loss.vf_coef >= 0) || !std::isfinite(loss.vf_coef))
    fail("align.vf_coef: must be >= 0, got {}", loss.vf_coef);
  if (!(epsilon > 0 && epsilon < 1)) fail("align.epsilon: must be in (0, 1), got {}", epsilon);
  if (!(epsilon_high >= 0)) fail("align.epsilon_high: must be >= 0, got {}", epsilon_high);
  loss.epsilon_low = epsilon;
  loss.epsilon_high = epsilon_high > 0 ? epsilon_high : epsilon;
  if (!(kl_coef >= 0) || !std::isfinite(kl_coef))
    fail("align.kl_coef: must be >= 0, got {}", kl_coef);
  loss.kl_coef = kl_coef;
  const int64_t G = rs.num_rollouts;
  if (G < 1) fail("align.num_generations: must be >= 1, got {}", G);
  if (G < 2 && !ppo)
    fail(
        "align.num_generations: {} with align.method={}: advantages compare a prompt's samples "
        "with each other, so at least 2",
        G, method);
  if (!(rs.sampling.temperature > 0))
    fail("align.temperature: {} samples greedily, so a prompt's samples would all be alike",
         rs.sampling.temperature);
  if (rs.max_tokens < 1) fail("align.max_tokens: must be >= 1, got {}", rs.max_tokens);
  if (max_prompt_length < 1)
    fail(
        "align.max_prompt_length: grpo and rloo keep the last max_prompt_length tokens of a "
        "longer prompt; set it (> 0)");
  if (max_prompt_length + rs.max_tokens > seq_len)
    fail(
        "train.seq_len: {} cannot hold align.max_prompt_length ({}) + align.max_tokens ({}) "
        "tokens",
        seq_len, max_prompt_length, rs.max_tokens);
  if (rollout_prompts < 0) fail("align.rollout_prompts: must be >= 0, got {}", rollout_prompts);
  if (rollout_prompts == 0) {
    if (global_batch % G)
      fail(
          "train.global_batch: {} completions is not a whole number of groups of "
          "align.num_generations = {}",
          global_batch, G);
    rollout_prompts = global_batch / G;
  }
  samples = rollout_prompts * G;
  if (samples % global_batch)
    fail(
        "align.rollout_prompts: {} prompts x {} generations = {} completions is not a whole "
        "number of train.global_batch = {}",
        rollout_prompts, G, samples, global_batch);
  if (ppo_epochs < 1) fail("align.ppo_epochs: must be >= 1, got {}", ppo_epochs);
  rounds_steps = ppo_epochs * (samples / global_batch);
  if (dynamic_sampling && loss.algorithm != RlAlgorithm::Grpo)
    fail("align.dynamic_sampling: GRPO's (DAPO); align.method={}", method);
  if (dynamic_sampling_max_batches < 1)
    fail("align.dynamic_sampling_max_batches: must be >= 1, got {}", dynamic_sampling_max_batches);
  if (log_completions_every < 0)
    fail("align.log_completions_every: must be >= 0, got {}", log_completions_every);
  if (!(kv_cache_mb >= 0)) fail("align.kv_cache_mb: must be >= 0, got {}", kv_cache_mb);
  if (!value_model.empty() && !ppo)
    fail("align.value_model: PPO's critic; align.method={} has none", method);
  if (!(critic_lr >= 0) || !std::isfinite(critic_lr))
    fail("align.critic_lr: must be >= 0, got {}", critic_lr);
  if (critic_lr > 0 && value_model.empty())
    fail("align.critic_lr: the learning rate of a critic of its own; set align.value_model");
}

std::map<std::string, std::string> OnlineRlConfig::signature() const {
  const RejectionSamplingOptions& s = sampling;
  return {{"align.online",
           fmt::format("{} loss {} scale {} eps {}/{} kl {} G {} prompts {} epochs {} "
                       "max_tokens {} T {} top_k {} top_p {} seed {} stop {} mask {} dyn {}/{} "
                       "gae {}/{} vclip {} vf {} whiten {}{}",
                       rl_algorithm_name(loss.algorithm), rl_loss_type_name(loss.loss_type),
                       scale_rewards, loss.epsilon_low, loss.epsilon_high, kl_coef, s.num_rollouts,
                       rollout_prompts, ppo_epochs, s.max_tokens, s.sampling.temperature,
                       s.sampling.top_k, s.sampling.top_p, s.sampling.seed,
                       s.stop.empty() ? "" : s.stop[0], mask_truncated, dynamic_sampling,
                       dynamic_sampling_max_batches, loss.gamma, loss.lam, loss.cliprange_value,
                       loss.vf_coef, loss.whiten_rewards,
                       value_model.empty() ? "" : " critic " + value_model) +
               (critic_lr > 0 ? fmt::format(" critic_lr {}", critic_lr) : "")}};
}

}  // namespace nk
