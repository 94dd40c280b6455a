#include "infer/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"

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

namespace nk {
namespace {

// min_p = 0.3 against probabilities in the ratio 1 : 0.5 : 0.2 : 0.05 keeps
// ids 0 and 1 only, sampled 2 : 1.
TEST(Sampler, MinPKeepsTokensAboveTheFractionOfTheBest) {
  const std::vector<float> l = {0.f, std::log(0.5f), std::log(0.2f), std::log(0.05f)};
  SamplingConfig c;
  c.min_p = 0.3;
  c.seed = 2;
  Sampler s(c);
  std::vector<int> count(4, 0);
  for (int i = 0; i < 3000; ++i) count[size_t(s.sample(l.data(), 4))]++;
  EXPECT_EQ(count[2] + count[3], 0);
  EXPECT_NEAR(count[0] / 3000.0, 2.0 / 3.0, 0.04);
  c.min_p = 0.1;  // now id 2 (0.2) is in, id 3 (0.05) still out
  Sampler s2(c);
  std::vector<int> c2(4, 0);
  for (int i = 0; i < 3000; ++i) c2[size_t(s2.sample(l.data(), 4))]++;
  EXPECT_GT(c2[2], 0);
  EXPECT_EQ(c2[3], 0);
}

// CTRL rule: positive logits of seen ids are divided by the penalty, negative
// ones multiplied; each distinct id once, however often it was seen.
TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingConfig c;
  c.temperature = 0;
  c.repetition_penalty = 2.0;
  Sampler s(c);
  const std::vector<float> a = {2.0f, -1.0f, 0.5f, 1.5f};  // 2.0 -> 1.0: id 3 wins
  const std::vector<int32_t> ctx_a = {0, 1, 1};
  EXPECT_EQ(s.sample(a.data(), 4), 0);
  EXPECT_EQ(s.sample(a.data(), 4, ctx_a), 3);
  const std::vector<float> b = {-0.5f, -0.8f, -0.3f};  // -0.3 -> -0.6: id 0 wins
  const std::vector<int32_t> ctx_b = {2};
  EXPECT_EQ(s.sample(b.data(), 3), 2);
  EXPECT_EQ(s.sample(b.data(), 3, ctx_b), 0);
  const std::vector<float> d = {2.0f, 0.9f};  // once: 1.0 > 0.9; thrice would be 0.25
  const std::vector<int32_t> ctx_d = {0, 0, 0};
  EXPECT_EQ(s.sample(d.data(), 2, ctx_d), 0);
  EXPECT_EQ(a[0], 2.0f);  // the caller's logits are untouched
}

TEST(Sampler, ValidateNamesTheOption) {
  SamplingConfig c;
  c.repetition_penalty = 0;
  EXPECT_THROW(validate(c), Error);
  c = {};
  c.top_p = 0;
  try {
    validate(c);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
}

}  // namespace
}  // namespace nk
