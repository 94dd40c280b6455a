#include "align/rewards/rewards_config.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "align/rewards/http_reward.h"
#include "core/config.h"
#include "core/error.h"

namespace nk {

const std::vector<std::string>& reward_function_names() {
  static const std::vector<std::string> names = {"accuracy", "format",  "length",
                                                 "model",    "command", "http"};
  return names;
}

void RewardsConfig::bind(ConfigBinder& b) {
  b.bind("align.reward_funcs", funcs,
         "grpo, rloo: the reward functions, comma-separated, summed with align.reward_weights: "
         "accuracy, format, length, model (align.reward_model), command (align.reward_command), "
         "http (align.reward_url)");
  b.bind("align.reward_weights", weights,
         "grpo, rloo: one weight per align.reward_funcs entry, comma-separated (\"\" = 1 each)");
  b.bind("align.reward_accuracy.answer_key", accuracy.answer_key,
         "accuracy reward: the prompt record's field holding the reference answer");
  b.bind("align.reward_accuracy.extract", accuracy.extract,
         "accuracy reward: how an answer is found in a completion (and in the reference): "
         "gsm8k (\"#### N\"), boxed (the last \\boxed{...}), marker (after "
         "align.reward_accuracy.marker), last_number, regex (align.reward_accuracy.pattern)");
  b.bind("align.reward_accuracy.pattern", accuracy.pattern,
         "accuracy reward, extract=regex: a PCRE2 pattern; the first match's first capture "
         "group (else the whole match) is the answer");
  b.bind("align.reward_accuracy.marker", accuracy.marker,
         "accuracy reward, extract=marker: the text before the answer (its last occurrence, any "
         "ASCII case; the answer runs to the end of the line)");
  b.bind("align.reward_accuracy.reference", accuracy.reference,
         "accuracy reward: extract (the reference answer goes through the same rule, its whole "
         "text when the rule finds nothing) or as_is");
  b.bind("align.reward_accuracy.compare", accuracy.compare,
         "accuracy reward: number (commas, '$' and units dropped, within "
         "align.reward_accuracy.tolerance) or exact (trimmed strings)");
  b.bind("align.reward_accuracy.tolerance", accuracy.tolerance,
         "accuracy reward, compare=number: the largest absolute difference counted equal");
  b.bind("align.reward_accuracy.ignore_case", accuracy.ignore_case,
         "accuracy reward, compare=exact: compare case-folded strings");
  b.bind("align.reward_format.pattern", format_pattern,
         "format reward: 1 when the whole completion matches this PCRE2 pattern ('.' matches "
         "newlines too), else 0; default DeepSeek-R1's <think>...</think><answer>...</answer>");
  b.bind("align.reward_length.max_tokens", length.max_tokens,
         "length reward: DAPO's L_max, completion tokens past which the penalty is -1 (0 = the "
         "run's max completion length)");
  b.bind("align.reward_length.cache_tokens", length.cache_tokens,
         "length reward: DAPO's L_cache, the band below L_max over which the penalty falls "
         "linearly from 0 to -1 (0 = L_max / 5)");
  b.bind("align.reward_length.per_token", length.per_token,
         "length reward: besides, minus this per completion token");
  b.bind("align.reward_command", command,
         "command reward: a command line (run by /bin/sh) reading one JSON object per rollout "
         "per line on stdin and writing one number (or {\"reward\": x}) per line on stdout");
  b.bind("align.reward_url", url,
         "http reward: an http:// URL taking POST {\"inputs\": [...]} and answering "
         "{\"rewards\": [...]}");
  b.bind("align.reward_timeout_s", timeout_s,
         "command and http rewards: seconds a grader has to answer one batch of rollouts");
}

void RewardsConfig::check() {
  names = split_commas(funcs);
  if (names.empty())
    fail("align.reward_funcs: no reward function given; list some of {}",
         fmt::join(reward_function_names(), ", "));
  const auto& known = reward_function_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (std::find(known.begin(), known.end(), names[i]) == known.end())
      fail("align.reward_funcs: '{}' is not a reward function; one of {}", names[i],
           fmt::join(known, ", "));
    for (size_t j = 0; j < i; ++j)
      if (names[i] == names[j]) fail("align.reward_funcs: '{}' is listed twice", names[i]);
  }
  weight_values.assign(names.size(), 1.0);
  if (!weights.empty()) {
    const std::vector<std::string> w = split_commas(weights);
    if (w.size() != names.size())
      fail("align.reward_weights: {} weights ({}) for {} reward functions ({})", w.size(), weights,
           names.size(), funcs);
    for (size_t i = 0; i < w.size(); ++i) {
      size_t used = 0;
      double x = NAN;
      try {
        x = std::stod(w[i], &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != w[i].size() || !std::isfinite(x))
        fail("align.reward_weights: '{}' (for {}) is not a finite number", w[i], names[i]);
      weight_values[i] = x;
    }
  }
  if (!(timeout_s > 0) || !std::isfinite(timeout_s))
    fail("align.reward_timeout_s: must be a finite number > 0, got {}", timeout_s);
  const auto listed = [&](const char* n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  if (listed("accuracy")) accuracy.check();
  if (listed("format")) RewardRegex("align.reward_format.pattern", format_pattern, true);
  if (listed("length")) length.check();
  if (listed("command") && command.find_first_not_of(" \t") == std::string::npos)
    fail("align.reward_command: align.reward_funcs lists command, but no command line is given");
  if (listed("http")) {
    if (url.empty()) fail("align.reward_url: align.reward_funcs lists http, but no URL is given");
    parse_http_url("align.reward_url", url);
  }
}

}  // namespace nk
