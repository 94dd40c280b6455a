#include "align/reward_loss.h"

#include <cmath>

#include "core/error.h"

namespace nk {

namespace {

// log(1 + e^x) without overflow.
double softplus(double x) {
  return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

double sigmoid(double x) {
  return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x));
}

}  // namespace

RewardLossResult reward_loss(std::span<const double> rewards, std::span<const double> margins,
                             double center_coefficient) {
  NK_CHECK(rewards.size() % 2 == 0 && !rewards.empty(), "reward_loss: {} rows, not pairs",
           rewards.size());
  const size_t n = rewards.size() / 2;
  NK_CHECK(margins.empty() || margins.size() == n, "reward_loss: {} margins for {} pairs",
           margins.size(), n);
  RewardLossResult r;
  r.dreward.assign(rewards.size(), 0.0);
  r.pairs = int64_t(n);
  for (size_t i = 0; i < n; ++i) {
    const double c = rewards[2 * i], j = rewards[2 * i + 1];
    const double z = c - j - (margins.empty() ? 0.0 : margins[i]);
    // -log s(z) = softplus(-z); d/dz = -s(-z).
    r.loss += softplus(-z) / double(n);
    const double g = -sigmoid(-z) / double(n);
    r.dreward[2 * i] += g;
    r.dreward[2 * i + 1] -= g;
    if (center_coefficient > 0) {
      const double s = c + j;
      r.loss += center_coefficient * s * s / double(n);
      const double d = 2 * center_coefficient * s / double(n);
      r.dreward[2 * i] += d;
      r.dreward[2 * i + 1] += d;
    }
    r.chosen_sum += c;
    r.rejected_sum += j;
    r.correct += c > j ? 1.0 : 0.0;
  }
  return r;
}

}  // namespace nk
