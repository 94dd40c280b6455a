// One reward function of a RewardSet (reward_set.h): a number per rollout.
#pragma once
#include <span>
#include <vector>

#include "align/rewards/reward_input.h"

namespace nk {

class RewardFunction {
 public:
  virtual ~RewardFunction() = default;
  // [in.size()] finite values. nk::Error naming the rollout (rollout_name)
  // or the grader on failure; the RewardSet adds the function's name.
  virtual std::vector<double> score(std::span<const RewardInput> in) = 0;
};

}  // namespace nk
