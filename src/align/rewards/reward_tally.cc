#include "align/rewards/reward_tally.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace nk {

void RewardTally::add(const RewardScores& s) {
  if (sums_.empty()) {
    names_.clear();
    verifiable_ = -1;
    for (size_t k = 0; k < s.parts.size(); ++k) {
      names_.push_back(s.parts[k].name);
      if (s.parts[k].verifiable && verifiable_ < 0) verifiable_ = int(k);
    }
    sums_.assign(3 + 2 * names_.size(), 0.0);
  }
  NK_CHECK(s.parts.size() == names_.size(), "RewardTally: {} functions after {}", s.parts.size(),
           names_.size());
  sums_[0] += double(s.total.size());
  for (double x : s.total) {
    sums_[1] += x;
    sums_[2] += x * x;
  }
  for (size_t k = 0; k < s.parts.size(); ++k) {
    NK_CHECK(s.parts[k].name == names_[k], "RewardTally: '{}' where '{}' was", s.parts[k].name,
             names_[k]);
    for (double x : s.parts[k].values) {
      sums_[3 + 2 * k] += x;
      sums_[4 + 2 * k] += x * x;
    }
  }
}

std::vector<std::pair<std::string, double>> RewardTally::figures() const {
  std::vector<std::pair<std::string, double>> f;
  if (sums_.empty() || sums_[0] <= 0) return f;
  const double n = sums_[0];
  const auto mean_std = [&](size_t at) {
    const double mean = sums_[at] / n;
    return std::pair{mean, std::sqrt(std::max(0.0, sums_[at + 1] / n - mean * mean))};
  };
  const auto [mean, sd] = mean_std(1);
  f.push_back({"reward", mean});
  f.push_back({"reward_std", sd});
  for (size_t k = 0; k < names_.size(); ++k) {
    const auto [m, s] = mean_std(3 + 2 * k);
    f.push_back({"rewards/" + names_[k] + "/mean", m});
    f.push_back({"rewards/" + names_[k] + "/std", s});
  }
  if (verifiable_ >= 0) f.push_back({"accuracy", sums_[3 + 2 * size_t(verifiable_)] / n});
  return f;
}

}  // namespace nk
