#include "infer/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace nk {
namespace {

const std::vector<float> kLogits = {0.5f, 2.0f, 1.0f, -1.0f, 1.9f};

TEST(Sampler, GreedyPicksTheLargestLogit) {
  Sampler s({0.0, 0, 1.0, 1});
  EXPECT_EQ(s.sample(kLogits.data(), 5), 1);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  Sampler k1({1.0, 1, 1.0, 3}), p0({1.0, 0, 1e-6, 3});
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(k1.sample(kLogits.data(), 5), 1);
    EXPECT_EQ(p0.sample(kLogits.data(), 5), 1);
  }
}

TEST(Sampler, TopKExcludesTheRest) {
  Sampler s({1.0, 2, 1.0, 5});  // only ids 1 (2.0) and 4 (1.9) are allowed
  for (int i = 0; i < 200; ++i) {
    int id = s.sample(kLogits.data(), 5);
    EXPECT_TRUE(id == 1 || id == 4) << id;
  }
}

TEST(Sampler, SameSeedSameSequenceAndFrequenciesFollowSoftmax) {
  Sampler a({1.0, 0, 1.0, 9}), b({1.0, 0, 1.0, 9});
  std::vector<int> count(5, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    int x = a.sample(kLogits.data(), 5);
    EXPECT_EQ(x, b.sample(kLogits.data(), 5));
    count[x]++;
  }
  double z = 0;
  for (float l : kLogits) z += std::exp(double(l));
  // 5 standard deviations of a binomial proportion at n = 20000 is < 0.018.
  for (int i = 0; i < 5; ++i)
    EXPECT_NEAR(double(count[i]) / n, std::exp(double(kLogits[i])) / z, 0.018) << i;
}

}  // namespace
}  // namespace nk
