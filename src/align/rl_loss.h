// The policy-gradient losses of online RL (align.method=grpo, rloo), as
// published, on host numbers: the advantages of a round's rewards and each
// completion token's loss term and its derivative with respect to the
// token's log-probability. The objective (online_objective.h) weights the
// terms per sequence or per token and hands the derivatives to the model's
// per-token head backward.
//
//  GRPO (DeepSeekMath; TRL's GRPOTrainer): G samples per prompt, advantage
//    A_i = (r_i - mean_g) / (std_g + 1e-4), std unbiased over the group
//    (scale_rewards=group), over the whole round (batch) or not divided
//    (none: Dr. GRPO).
//  RLOO (Ahmadian et al. 2024): A_i = r_i - mean_{j != i} r_j.
//  Per completion token t, with ratio rho = exp(logp - old_logp):
//    l_t = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)
//          + beta (exp(ref - logp) - (ref - logp) - 1)        (k3 KL, GRPO)
//  clipped: the token's gradient is 0 when the clipped term is the smaller.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace nk {

enum class RlAlgorithm { Grpo, Rloo };
// How token terms are summed into a step's loss (TRL's loss_type):
//  grpo     mean over sequences of each sequence's token mean
//  dr_grpo  sum over tokens / (sequences x max_completion_length)
//  dapo     sum over tokens / tokens in the step (token-level)
enum class RlLossType { Grpo, DrGrpo, Dapo };
enum class RewardScaling { Group, Batch, None };

RlLossType parse_rl_loss_type(const std::string& s, const std::string& key);
RewardScaling parse_reward_scaling(const std::string& s, const std::string& key);
const char* rl_loss_type_name(RlLossType t);

struct RlLossConfig {
  RlAlgorithm algorithm = RlAlgorithm::Grpo;
  RlLossType loss_type = RlLossType::Grpo;
  RewardScaling scale_rewards = RewardScaling::Group;
  double epsilon_low = 0.2, epsilon_high = 0.2;
  double kl_coef = 0;  // GRPO: beta of the k3 term in the loss; RLOO: of the KL in the reward
};

// Advantages of n = groups x G rewards, group g at [g G, (g + 1) G).
std::vector<double> rl_advantages(const RlLossConfig& c, std::span<const double> rewards,
                                  int64_t G);

// True where group g's rewards are not all equal (DAPO's dynamic sampling
// keeps those: a group of equal rewards has zero advantages).
std::vector<bool> groups_with_variance(std::span<const double> rewards, int64_t G);

struct RlTokenTerm {
  double loss = 0;                                 // l_t
  double dlogp = 0;                                // d l_t / d logp
  double kl = 0;                                   // the k3 estimate (0 without a reference)
  bool low_clipped = false, high_clipped = false;  // TRL's clip_ratio/low_mean, high_mean
};
// One token's term; ref_logp is read only when with_ref.
RlTokenTerm rl_token_term(const RlLossConfig& c, double logp, double old_logp, double ref_logp,
                          bool with_ref, double advantage);

}  // namespace nk
