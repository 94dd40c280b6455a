// The reward functions of an online RL run (align.reward_funcs), built once
// and called per batch of rollouts: each function's unweighted values and
// their weighted sum (TRL's reward_funcs/reward_weights; NeMo-RL's and
// veRL's reward managers).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "align/rewards/model_reward.h"
#include "align/rewards/reward_function.h"
#include "align/rewards/reward_input.h"
#include "align/rewards/rewards_config.h"

namespace nk {

class RewardSet {
 public:
  // Checks `cfg` (RewardsConfig::check) and builds every listed function:
  // `model` is read only when align.reward_funcs lists model;
  // `max_completion_tokens` is the length reward's L_max when
  // align.reward_length.max_tokens is 0. nk::Error naming the key.
  RewardSet(const RewardsConfig& cfg, const RewardModelSource& model,
            int64_t max_completion_tokens = 0);
  ~RewardSet();
  RewardSet(RewardSet&&) noexcept;

  // Every function's values (and weighted totals) for the rollouts. nk::Error
  // "reward 'NAME': ..." naming the rollout or grader on failure.
  RewardScores score(std::span<const RewardInput> in);
  std::vector<std::string> names() const;

 private:
  struct Entry {
    std::string name;
    double weight = 1;
    bool verifiable = false;
    std::unique_ptr<RewardFunction> fn;
  };
  std::vector<Entry> funcs_;
};

}  // namespace nk
