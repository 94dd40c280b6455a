// The rule-based reward functions: accuracy (the answer a completion states
// against the record's reference, answer_match.h), format (the completion
// follows a required template) and length (DAPO's overlong penalty).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "align/rewards/answer_match.h"
#include "align/rewards/reward_function.h"

namespace nk {

// 1 when the completion states the answer in record[answer_key], else 0.
// nk::Error naming the rollout and the key when the record lacks the field
// or holds other than a string or a number there.
class AccuracyReward : public RewardFunction {
 public:
  explicit AccuracyReward(const AccuracyRewardOptions& opt) : opt_(opt), match_(opt) {}
  std::vector<double> score(std::span<const RewardInput> in) override;

 private:
  AccuracyRewardOptions opt_;
  AnswerMatcher match_;
};

// DeepSeek-R1's template: reasoning in <think>, then the answer in <answer>.
inline constexpr const char* kThinkAnswerFormat =
    R"(\s*<think>.*?</think>\s*<answer>.*?</answer>\s*)";

// 1 when the whole completion matches `pattern` ('.' matching newlines too),
// else 0 (TRL's format rewards).
class FormatReward : public RewardFunction {
 public:
  explicit FormatReward(const std::string& pattern)
      : re_("align.reward_format.pattern", pattern, true) {}
  std::vector<double> score(std::span<const RewardInput> in) override;

 private:
  RewardRegex re_;
};

struct LengthRewardOptions {
  int64_t max_tokens = 0;    // L_max (0: the run's max completion length)
  int64_t cache_tokens = 0;  // L_cache, the soft band below L_max (0: L_max / 5)
  double per_token = 0;      // besides: -per_token for every completion token
  // nk::Error naming the align.reward_length.* key for a bad value.
  void check() const;
};

// DAPO's overlong reward shaping (Yu et al. 2025, eq. 13) of a completion of
// L tokens, with L_max and L_cache:
//   0                               L <= L_max - L_cache
//   ((L_max - L_cache) - L) / L_cache   L_max - L_cache < L <= L_max
//   -1                              L > L_max
// minus per_token * L.
double overlong_penalty(int64_t length, int64_t max_tokens, int64_t cache_tokens);

class LengthReward : public RewardFunction {
 public:
  // `max_completion_tokens`: the run's limit, L_max when max_tokens is 0.
  LengthReward(const LengthRewardOptions& opt, int64_t max_completion_tokens);
  std::vector<double> score(std::span<const RewardInput> in) override;

 private:
  int64_t max_ = 0, cache_ = 0;
  double per_token_ = 0;
};

}  // namespace nk
