#include "align/rewards/verifiable_rewards.h"

#include <cmath>

#include "core/error.h"

namespace nk {

std::vector<double> AccuracyReward::score(std::span<const RewardInput> in) {
  std::vector<double> v(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const nlohmann::json* rec = in[i].record;
    const std::string& key = opt_.answer_key;
    const auto it = rec && rec->is_object() ? rec->find(key) : nlohmann::json::const_iterator();
    if (!rec || !rec->is_object() || it == rec->end())
      fail("{}: no \"{}\" field (align.reward_accuracy.answer_key) holding the reference answer",
           rollout_name(in, i), key);
    std::string ref;
    if (it->is_string())
      ref = it->get<std::string>();
    else if (it->is_number())
      ref = it->dump();
    else
      fail("{}: \"{}\" (align.reward_accuracy.answer_key) is {}, not a string or a number",
           rollout_name(in, i), key, it->type_name());
    try {
      v[i] = match_.score(in[i].completion, ref);
    } catch (const Error& e) {
      throw e.with_context(fmt::format("{}: \"{}\"", rollout_name(in, i), key));
    }
  }
  return v;
}

std::vector<double> FormatReward::score(std::span<const RewardInput> in) {
  std::vector<double> v(in.size());
  for (size_t i = 0; i < in.size(); ++i) v[i] = re_.full_match(in[i].completion) ? 1.0 : 0.0;
  return v;
}

void LengthRewardOptions::check() const {
  if (max_tokens < 0) fail("align.reward_length.max_tokens: must be >= 0, got {}", max_tokens);
  if (cache_tokens < 0)
    fail("align.reward_length.cache_tokens: must be >= 0, got {}", cache_tokens);
  if (max_tokens > 0 && cache_tokens > max_tokens)
    fail("align.reward_length.cache_tokens: {} is more than align.reward_length.max_tokens {}",
         cache_tokens, max_tokens);
  if (!(per_token >= 0) || !std::isfinite(per_token))
    fail("align.reward_length.per_token: must be a finite number >= 0, got {}", per_token);
}

double overlong_penalty(int64_t length, int64_t max_tokens, int64_t cache_tokens) {
  if (length > max_tokens) return -1;
  const int64_t expected = max_tokens - cache_tokens;
  if (length <= expected) return 0;
  return double(expected - length) / double(cache_tokens);
}

LengthReward::LengthReward(const LengthRewardOptions& opt, int64_t max_completion_tokens)
    : per_token_(opt.per_token) {
  opt.check();
  max_ = opt.max_tokens > 0 ? opt.max_tokens : max_completion_tokens;
  if (max_ < 1)
    fail(
        "align.reward_length.max_tokens: 0, and the run gives no max completion length to "
        "take instead; set it");
  cache_ = opt.cache_tokens > 0 ? opt.cache_tokens : max_ / 5;
  if (cache_ > max_)
    fail("align.reward_length.cache_tokens: {} is more than the max length {}", cache_, max_);
}

std::vector<double> LengthReward::score(std::span<const RewardInput> in) {
  std::vector<double> v(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const int64_t n = in[i].completion_tokens;
    if (n < 0) fail("{}: completion_tokens {} < 0", rollout_name(in, i), n);
    v[i] = overlong_penalty(n, max_, cache_) - per_token_ * double(n);
  }
  return v;
}

}  // namespace nk
