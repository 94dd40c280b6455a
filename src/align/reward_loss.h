// The reward model's pairwise loss (Bradley-Terry), a pure function of the
// scores: rows come in twos as in preference_loss.h, row 2i pair i's chosen
// sequence and row 2i+1 its rejected one, each with its scalar reward r.
//
//   loss = mean_i -log s(r_c - r_r - m_i) + center x mean_i (r_c + r_r)^2
//
// m_i: pair i's margin (Llama 2's margin term; TRL's "margin" column, 0
// without one); center: TRL's center_rewards_coefficient (Eisenstein et al.,
// 2023), which keeps the rewards near zero.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace nk {

struct RewardLossResult {
  double loss = 0;
  std::vector<double> dreward;  // d loss / d r of each row, [2n]
  // TRL's figures, summed over the pairs (a step averages them).
  double chosen_sum = 0, rejected_sum = 0;  // the rewards
  double correct = 0;                       // pairs with r_c > r_r (as TRL, a tie is wrong)
  int64_t pairs = 0;
};

// rewards [2n]; margins [n] or empty (none). nk::Error for an odd count or a
// margin count that is not n.
RewardLossResult reward_loss(std::span<const double> rewards, std::span<const double> margins,
                             double center_coefficient);

}  // namespace nk
