// The reward figures of a step for the log and metrics.jsonl, named as TRL's
// GRPOTrainer logs them: "reward" and "reward_std" (the weighted total's mean
// and standard deviation), "rewards/NAME/mean" and "rewards/NAME/std" per
// function (unweighted), and "accuracy" (the mean of the verifiable
// function, when one is listed). Kept as sums so that data-parallel ranks
// add theirs (an all-reduce of sums()) before figures() is read.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "align/rewards/reward_input.h"

namespace nk {

class RewardTally {
 public:
  // Adds a batch's scores (its functions must be the same, in the same order,
  // every time).
  void add(const RewardScores& s);
  // [rollouts, total sum, total sum of squares, then per function: sum, sum
  // of squares]; empty before the first add(). Summed elementwise over ranks.
  std::vector<double>& sums() { return sums_; }
  const std::vector<double>& sums() const { return sums_; }
  // The figures (population standard deviations); none before an add().
  std::vector<std::pair<std::string, double>> figures() const;
  void clear() { sums_.clear(); }

 private:
  std::vector<std::string> names_;
  int verifiable_ = -1;  // the index of the verifiable function, if any
  std::vector<double> sums_;
};

}  // namespace nk
