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
//
//  PPO (Schulman et al. 2017; Ziegler et al. 2019's RLHF form, TRL's
//    PPOTrainer, NeMo-Aligner): per completion token t a reward
//    r_t = -kl_coef (old_logp_t - ref_logp_t) (k1 KL to the reference), the
//    sequence's score added at its last token; optionally whitened over the
//    round without moving their mean (whiten_rewards); GAE over the value
//    head's V_t: delta_t = r_t + gamma V_{t+1} - V_t (V after the last token
//    0), A_t = delta_t + gamma lambda A_{t+1}, returns R_t = A_t + V_t; the
//    advantages whitened over the round. The policy's token term is the
//    clipped one above with A_t (no KL in the loss: it is in the reward),
//    plus vf_coef x the clipped value loss
//    0.5 max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace nk {

enum class RlAlgorithm { Grpo, Rloo, Ppo };
// How token terms are summed into a step's loss (TRL's loss_type):
//  grpo     mean over sequences of each sequence's token mean
//  dr_grpo  sum over tokens / (sequences x max_completion_length)
//  dapo     sum over tokens / tokens in the step (token-level)
enum class RlLossType { Grpo, DrGrpo, Dapo };
enum class RewardScaling { Group, Batch, None };

RlLossType parse_rl_loss_type(const std::string& s, const std::string& key);
RewardScaling parse_reward_scaling(const std::string& s, const std::string& key);
const char* rl_loss_type_name(RlLossType t);
const char* rl_algorithm_name(RlAlgorithm a);  // grpo, rloo, ppo

struct RlLossConfig {
  RlAlgorithm algorithm = RlAlgorithm::Grpo;
  RlLossType loss_type = RlLossType::Grpo;
  RewardScaling scale_rewards = RewardScaling::Group;
  double epsilon_low = 0.2, epsilon_high = 0.2;
  double kl_coef = 0;  // GRPO: beta of the k3 term in the loss; RLOO, PPO: of the KL in the reward
  // PPO's:
  double gamma = 1, lam = 0.95;  // GAE's discount and lambda
  double cliprange_value = 0.2;  // the value's clip around the round's value
  double vf_coef = 0.1;          // the value loss's weight
  bool whiten_rewards = false;
};

// GAE over one sequence: advantages and returns [n] from per-token rewards
// and values [n] (the value after the last token is 0).
void gae(std::span<const double> rewards, std::span<const double> values, double gamma, double lam,
         std::span<double> advantages, std::span<double> returns);

// Mean and variance of values accumulated over a round (each rank's part,
// summed over ranks): whitening as TRL's masked_whiten, (x - mean) /
// sqrt(var + 1e-8) with the unbiased variance, the mean added back unless
// shift_mean.
struct Moments {
  double n = 0, sum = 0, sumsq = 0;
  void add(double x) {
    n += 1;
    sum += x;
    sumsq += x * x;
  }
  double whiten(double x, bool shift_mean) const;
};

struct RlValueTerm {
  double loss = 0;  // 0.5 max(...)
  double dvalue = 0;
  bool clipped = false;  // the clipped term was the larger (TRL's val/clipfrac)
};
// PPO's value loss at one token: the value head's v, the round's v_old and
// the return.
RlValueTerm ppo_value_term(const RlLossConfig& c, double v, double v_old, double ret);

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
