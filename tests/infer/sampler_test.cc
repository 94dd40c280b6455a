#include "infer/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace nk {
namespace {

const std::vector<float> kLogits = {0.5f, 2.0f, 1.0f, -1.0f, 1.9f};

TEST(Sampler, GreedyPicksTheLargestLogit) {
  Sampler s({0.0, 0, 1.0, 1});
  EXPECT_EQ(s.sample(kLogits.data(), 5), 1);
}

// Issue 44, item 11: NaN logits (an adapter whose scaling overflowed) once
// gave a repeated token with logprob -nan and exit 0.
TEST(Sampler, NonFiniteLogitsAreAnErrorNotAToken) {
  for (float bad : {NAN, INFINITY}) {
    std::vector<float> l = kLogits;
    l[3] = bad;
    for (double temperature : {0.0, 1.0}) {
      Sampler s({temperature, 0, 1.0, 1});
      try {
        s.sample(l.data(), 5);
        ADD_FAILURE() << "sampled from " << bad;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("the model's logits are not finite (id 3"),
                  std::string::npos)
            << e.what();
      }
    }
  }
  std::vector<float> masked = kLogits;
  masked[1] = -INFINITY;  // a mask, not an overflow
  EXPECT_EQ(Sampler({0.0, 0, 1.0, 1}).sample(masked.data(), 5), 4);
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

// OpenAI's rule: logit[t] -= presence * (count[t] > 0) + frequency * count[t],
// count[t] over the generated ids only.
TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  const std::vector<float> l = {2.0f, 1.8f, 1.0f, 0.5f};
  const std::vector<int32_t> none, zero = {0}, zero3 = {0, 0, 0}, one = {1};
  SamplingConfig c;
  c.temperature = 0;
  c.presence_penalty = 0.5;  // 2.0 -> 1.5 once id 0 was generated, however often
  Sampler p(c);
  EXPECT_EQ(p.sample(l.data(), 4, none, none), 0);
  EXPECT_EQ(p.sample(l.data(), 4, none, zero), 1);
  EXPECT_EQ(p.sample(l.data(), 4, none, zero3), 1);
  EXPECT_EQ(p.sample(l.data(), 4, zero3, none), 0);  // the prompt is not counted
  EXPECT_EQ(p.sample(l.data(), 4, zero3, one), 0);
  const std::vector<int32_t> outside = {-1, 4, 99};  // ids outside the vocabulary: ignored
  EXPECT_EQ(p.sample(l.data(), 4, none, outside), 0);
  c.presence_penalty = 0;
  c.frequency_penalty = 0.1;  // once: 1.9 > 1.8; thrice: 1.7 < 1.8
  Sampler f(c);
  EXPECT_EQ(f.sample(l.data(), 4, none, zero), 0);
  EXPECT_EQ(f.sample(l.data(), 4, none, zero3), 1);
  EXPECT_EQ(f.sample(l.data(), 4, zero3, zero), 0);    // prompt copies add nothing
  const std::vector<int32_t> mixed = {0, 2, 0, 0, 2};  // id 0 thrice among others
  EXPECT_EQ(f.sample(l.data(), 4, none, mixed), 1);
  // Both: 2.0 - 0.05 - 2 * 0.1 = 1.75 < 1.8.
  c.presence_penalty = 0.05;
  const std::vector<int32_t> zero2 = {0, 0};
  Sampler pf(c);
  EXPECT_EQ(pf.sample(l.data(), 4, none, zero), 0);  // 1.85
  EXPECT_EQ(pf.sample(l.data(), 4, none, zero2), 1);
  EXPECT_EQ(l[0], 2.0f);  // the caller's logits are untouched
}

TEST(Sampler, NegativePenaltiesEncourageRepeats) {
  const std::vector<float> l = {2.0f, 1.8f, 1.0f};
  const std::vector<int32_t> none, one = {1}, one3 = {1, 1, 1}, two = {2};
  SamplingConfig c;
  c.temperature = 0;
  c.presence_penalty = -0.5;  // 1.8 -> 2.3
  Sampler p(c);
  EXPECT_EQ(p.sample(l.data(), 3, none, one), 1);
  EXPECT_EQ(p.sample(l.data(), 3, one, none), 0);
  EXPECT_EQ(p.sample(l.data(), 3, none, two), 0);  // 1.5 < 2.0
  c.presence_penalty = 0;
  c.frequency_penalty = -0.1;  // once: 1.9 < 2.0; thrice: 2.1 > 2.0
  Sampler f(c);
  EXPECT_EQ(f.sample(l.data(), 3, none, one), 0);
  EXPECT_EQ(f.sample(l.data(), 3, none, one3), 1);
}

// repetition_penalty keeps looking at prompt and generated ids alike, each
// distinct id once, and comes before the presence penalty.
TEST(Sampler, RepetitionPenaltySeesThePromptAndComesFirst) {
  const std::vector<float> l = {2.0f, 0.9f, 1.5f};
  const std::vector<int32_t> none, zero = {0}, two = {2}, zero2 = {0, 2};
  SamplingConfig c;
  c.temperature = 0;
  c.repetition_penalty = 2.0;
  Sampler r(c);
  EXPECT_EQ(r.sample(l.data(), 3, zero, none), 2);  // 2.0 -> 1.0 < 1.5
  EXPECT_EQ(r.sample(l.data(), 3, none, zero), 2);
  EXPECT_EQ(r.sample(l.data(), 3, zero, two), 0);    // 1.0 vs 0.75
  EXPECT_EQ(r.sample(l.data(), 3, zero2, zero), 0);  // id 0 divided once, not twice
  // 2.0 / 2 - 0.2 = 0.8 < 0.9 (presence first would tie at 0.9 and pick id 0).
  const std::vector<float> m = {2.0f, 0.9f};
  c.presence_penalty = 0.2;
  Sampler rp(c);
  EXPECT_EQ(rp.sample(m.data(), 2, none, zero), 1);
  EXPECT_EQ(rp.sample(m.data(), 2, zero, none), 0);  // 1.0: the prompt is not counted
}

// With the penalties at 0 (or with nothing generated yet) the sampler reads
// neither span: its picks and its RNG's draws are those of a sampler given no
// context at all, and where the context splits does not matter to
// repetition_penalty.
TEST(Sampler, PenaltiesOffOrNothingGeneratedChangeNoDraw) {
  Rng rng(11);
  std::vector<float> l(50);
  std::vector<int32_t> ctx(30);
  for (double t : {0.0, 0.7, 1.3}) {
    SamplingConfig base;
    base.temperature = t;
    base.top_k = 20;
    base.top_p = 0.9;
    base.seed = 5;
    SamplingConfig zero = base, pres = base;
    zero.presence_penalty = 0;
    zero.frequency_penalty = 0;
    pres.presence_penalty = 1.5;
    pres.frequency_penalty = -1;
    SamplingConfig rep = base;
    rep.repetition_penalty = 1.4;
    Sampler a(base), b(zero), p(pres), r1(rep), r2(rep);
    for (int i = 0; i < 500; ++i) {
      for (float& x : l) x = float(rng.uniform() * 6 - 3);
      for (int32_t& x : ctx) x = int32_t(rng.below(50));
      const std::span<const int32_t> all(ctx);
      const int32_t want = a.sample(l.data(), 50);
      EXPECT_EQ(b.sample(l.data(), 50, all.first(10), all.subspan(10)), want);
      EXPECT_EQ(p.sample(l.data(), 50, all, {}), want);
      EXPECT_EQ(r1.sample(l.data(), 50, all),
                r2.sample(l.data(), 50, all.first(7), all.subspan(7)));
    }
  }
}

TEST(Sampler, ValidateNamesTheOption) {
  for (const char* key : {"presence_penalty", "frequency_penalty"})
    for (double v : {2.5, -2.5, std::nan("")}) {
      SamplingConfig c;
      (std::string(key) == "presence_penalty" ? c.presence_penalty : c.frequency_penalty) = v;
      try {
        validate(c);
        ADD_FAILURE() << key << " " << v;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
      }
      (std::string(key) == "presence_penalty" ? c.presence_penalty : c.frequency_penalty) =
          v > 0 ? 2.0 : -2.0;
      EXPECT_NO_THROW(validate(c));
    }

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

namespace nk {
namespace {

// A model whose vocabulary is padded past its tokenizer's: the padding ids
// (5..7 here, the tokenizer has 5) hold the largest logits and are never
// sampled, greedy included, whatever the filters and penalties (a penalty
// never lifts them either); over the real ids the draws are those of the
// unpadded logits, the same seed giving the same tokens.
TEST(Sampler, PaddingIdsPastTheVocabularyAreNeverSampled) {
  std::vector<float> padded = kLogits;
  padded.insert(padded.end(), {50.f, 9.f, 40.f});
  const int64_t V = int64_t(padded.size()), real = int64_t(kLogits.size());
  const std::vector<int32_t> prompt = {5, 6, 7, 1}, generated = {7, 7, 6, 1, 1};
  std::vector<SamplingConfig> configs = {
      {0.0, 0, 1.0, 1},                        // greedy
      {1.0, 0, 1.0, 2},                        // temperature
      {5.0, 3, 1.0, 3},                        // top-k
      {3.0, 0, 0.9, 4},                        // top-p
      {2.0, 0, 1.0, 5, 0.01},                  // min-p
      {1.0, 0, 1.0, 6, 0.0, 0.2},              // repetition penalty
      {1.0, 0, 1.0, 7, 0.0, 1.0, -2.0, -2.0},  // negative penalties
      {0.0, 0, 1.0, 8, 0.0, 1.0, 2.0, 2.0}};   // penalties, greedy
  for (size_t c = 0; c < configs.size(); ++c) {
    SCOPED_TRACE(c);
    Sampler masked(configs[c], real), plain(configs[c]);
    for (int i = 0; i < 300; ++i) {
      const int32_t id = masked.sample(padded.data(), V, prompt, generated);
      ASSERT_GE(id, 0);
      ASSERT_LT(id, real);
      // The unpadded logits, with the padding ids left out of the context too.
      EXPECT_EQ(id, plain.sample(kLogits.data(), real, std::span(prompt).subspan(3),
                                 std::span(generated).subspan(3)));
    }
  }
  EXPECT_EQ(Sampler({0.0, 0, 1.0, 1}, real).sample(padded.data(), V), 1);
  // Without the tokenizer's size every row is a token: the padding wins.
  EXPECT_EQ(Sampler({0.0, 0, 1.0, 1}).sample(padded.data(), V), 5);
}

}  // namespace
}  // namespace nk
