#include "align/rl_loss.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace nk {

RlLossType parse_rl_loss_type(const std::string& s, const std::string& key) {
  if (s == "grpo") return RlLossType::Grpo;
  if (s == "dr_grpo") return RlLossType::DrGrpo;
  if (s == "dapo") return RlLossType::Dapo;
  fail("{}: '{}' is not an online loss type (grpo, dr_grpo, dapo)", key, s);
}

RewardScaling parse_reward_scaling(const std::string& s, const std::string& key) {
  if (s == "group") return RewardScaling::Group;
  if (s == "batch") return RewardScaling::Batch;
  if (s == "none") return RewardScaling::None;
  fail("{}: '{}' is not group, batch or none", key, s);
}

const char* rl_loss_type_name(RlLossType t) {
  switch (t) {
    case RlLossType::Grpo:
      return "grpo";
    case RlLossType::DrGrpo:
      return "dr_grpo";
    case RlLossType::Dapo:
      return "dapo";
  }
  return "?";
}

const char* rl_algorithm_name(RlAlgorithm a) {
  switch (a) {
    case RlAlgorithm::Grpo:
      return "grpo";
    case RlAlgorithm::Rloo:
      return "rloo";
    case RlAlgorithm::Ppo:
      return "ppo";
  }
  return "?";
}

namespace {

double mean_of(std::span<const double> v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / double(v.size());
}

// Unbiased (n - 1), as torch.std; 0 for a single value.
double std_of(std::span<const double> v) {
  if (v.size() < 2) return 0;
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size() - 1));
}

}  // namespace

std::vector<double> rl_advantages(const RlLossConfig& c, std::span<const double> rewards,
                                  int64_t G) {
  const int64_t n = int64_t(rewards.size());
  NK_CHECK(G >= 1 && n % G == 0, "rl_advantages: {} rewards in groups of {}", n, G);
  std::vector<double> a(static_cast<size_t>(n));
  for (int64_t g = 0; g < n; g += G) {
    const std::span<const double> r = rewards.subspan(size_t(g), size_t(G));
    const double m = mean_of(r);
    for (int64_t i = 0; i < G; ++i) {
      double& out = a[size_t(g + i)];
      if (c.algorithm == RlAlgorithm::Rloo)  // mean of the others = (G m - r_i) / (G - 1)
        out = G > 1 ? r[size_t(i)] - (double(G) * m - r[size_t(i)]) / double(G - 1) : 0.0;
      else
        out = r[size_t(i)] - m;
    }
    if (c.algorithm == RlAlgorithm::Grpo && c.scale_rewards == RewardScaling::Group) {
      const double s = std_of(r);
      for (int64_t i = 0; i < G; ++i) a[size_t(g + i)] /= s + 1e-4;
    }
  }
  if (c.algorithm == RlAlgorithm::Grpo && c.scale_rewards == RewardScaling::Batch) {
    const double s = std_of(rewards);
    for (double& v : a) v /= s + 1e-4;
  }
  return a;
}

std::vector<bool> groups_with_variance(std::span<const double> rewards, int64_t G) {
  NK_CHECK(G >= 1 && rewards.size() % size_t(G) == 0, "groups_with_variance: {} in groups of {}",
           rewards.size(), G);
  std::vector<bool> keep;
  for (size_t g = 0; g < rewards.size(); g += size_t(G)) {
    const auto r = rewards.subspan(g, size_t(G));
    keep.push_back(std::any_of(r.begin(), r.end(), [&](double x) { return x != r[0]; }));
  }
  return keep;
}

void gae(std::span<const double> rewards, std::span<const double> values, double gamma, double lam,
         std::span<double> advantages, std::span<double> returns) {
  const size_t n = rewards.size();
  NK_CHECK(values.size() == n && advantages.size() == n && returns.size() == n,
           "gae: {} rewards, {} values", n, values.size());
  double next_value = 0, next_adv = 0;
  for (size_t t = n; t-- > 0;) {
    const double delta = rewards[t] + gamma * next_value - values[t];
    advantages[t] = delta + gamma * lam * next_adv;
    returns[t] = advantages[t] + values[t];
    next_value = values[t];
    next_adv = advantages[t];
  }
}

double Moments::whiten(double x, bool shift_mean) const {
  NK_CHECK(n >= 2, "whitening over {} values", n);
  const double mean = sum / n;
  const double var = std::max(0.0, (sumsq - n * mean * mean) / (n - 1));
  const double w = (x - mean) / std::sqrt(var + 1e-8);
  return shift_mean ? w : w + mean;
}

RlValueTerm ppo_value_term(const RlLossConfig& c, double v, double v_old, double ret) {
  RlValueTerm t;
  const double vc = std::clamp(v, v_old - c.cliprange_value, v_old + c.cliprange_value);
  const double a = v - ret, b = vc - ret;
  if (a * a >= b * b) {
    t.loss = 0.5 * a * a;
    t.dvalue = a;
  } else {  // the clipped value's: no gradient where the clip holds it
    t.loss = 0.5 * b * b;
    t.dvalue = v == vc ? b : 0.0;
    t.clipped = true;
  }
  return t;
}

RlTokenTerm rl_token_term(const RlLossConfig& c, double logp, double old_logp, double ref_logp,
                          bool with_ref, double advantage) {
  RlTokenTerm t;
  const double rho = std::exp(logp - old_logp);
  const double lo = 1 - c.epsilon_low, hi = 1 + c.epsilon_high;
  const double clipped = std::clamp(rho, lo, hi);
  const double unclipped_term = rho * advantage, clipped_term = clipped * advantage;
  // -min(rho A, clip(rho) A): the unclipped term's gradient where it is the
  // smaller (or the ratio is inside the range, where both are the same).
  const bool inside = rho >= lo && rho <= hi;
  t.loss = -std::min(unclipped_term, clipped_term);
  t.dlogp = inside || unclipped_term <= clipped_term ? -advantage * rho : 0.0;
  t.low_clipped = rho < lo && advantage < 0;
  t.high_clipped = rho > hi && advantage > 0;
  if (with_ref && c.algorithm == RlAlgorithm::Grpo && c.kl_coef != 0) {
    const double d = ref_logp - logp;
    t.kl = std::exp(d) - d - 1;
    t.loss += c.kl_coef * t.kl;
    t.dlogp += c.kl_coef * (1 - std::exp(d));
  }
  return t;
}

}  // namespace nk
