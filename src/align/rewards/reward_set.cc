#include "align/rewards/reward_set.h"

#include <chrono>
#include <cmath>

#include "align/rewards/command_reward.h"
#include "align/rewards/http_reward.h"
#include "align/rewards/verifiable_rewards.h"
#include "core/error.h"

namespace nk {

RewardSet::RewardSet(const RewardsConfig& config, const RewardModelSource& model,
                     int64_t max_completion_tokens) {
  RewardsConfig cfg = config;
  cfg.check();
  const auto timeout = std::chrono::milliseconds(int64_t(std::ceil(cfg.timeout_s * 1000)));
  for (size_t i = 0; i < cfg.names.size(); ++i) {
    Entry e{cfg.names[i], cfg.weight_values[i], false, nullptr};
    if (e.name == "accuracy") {
      e.fn = std::make_unique<AccuracyReward>(cfg.accuracy);
      e.verifiable = true;
    } else if (e.name == "format") {
      e.fn = std::make_unique<FormatReward>(cfg.format_pattern);
    } else if (e.name == "length") {
      e.fn = std::make_unique<LengthReward>(cfg.length, max_completion_tokens);
    } else if (e.name == "model") {
      e.fn = std::make_unique<ModelReward>(model);
    } else if (e.name == "command") {
      e.fn = std::make_unique<CommandReward>(cfg.command, timeout);
    } else if (e.name == "http") {
      e.fn = std::make_unique<HttpReward>(cfg.url, timeout);
    } else {
      NK_CHECK(false, "RewardSet: '{}' passed check() but has no function", e.name);
    }
    funcs_.push_back(std::move(e));
  }
}

RewardSet::~RewardSet() = default;
RewardSet::RewardSet(RewardSet&&) noexcept = default;

RewardScores RewardSet::score(std::span<const RewardInput> in) {
  RewardScores s;
  s.total.assign(in.size(), 0.0);
  for (Entry& e : funcs_) {
    std::vector<double> v;
    try {
      v = e.fn->score(in);
    } catch (const Error& err) {
      throw err.with_context(fmt::format("reward '{}'", e.name));
    }
    NK_CHECK(v.size() == in.size(), "reward '{}': {} values for {} rollouts", e.name, v.size(),
             in.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if (!std::isfinite(v[i]))
        fail("reward '{}': {}: the value {} is not finite", e.name, rollout_name(in, i), v[i]);
      s.total[i] += e.weight * v[i];
    }
    s.parts.push_back({e.name, e.weight, e.verifiable, std::move(v)});
  }
  return s;
}

std::vector<std::string> RewardSet::names() const {
  std::vector<std::string> n;
  for (const Entry& e : funcs_) n.push_back(e.name);
  return n;
}

}  // namespace nk
