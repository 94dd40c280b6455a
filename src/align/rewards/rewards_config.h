// The align.reward_* keys of online RL (align.method=grpo, rloo): which
// reward functions score a rollout, their weights (TRL's reward_funcs and
// reward_weights) and each function's settings. The reward model's keys are
// rejection sampling's (align.reward_model, align.scorer_dtype,
// align.score_batch_size: AlignSamplingConfig binds them; see
// model_reward.h's RewardModelSource).
#pragma once
#include <string>
#include <vector>

#include "align/rewards/answer_match.h"
#include "align/rewards/verifiable_rewards.h"
#include "core/config_bind.h"

namespace nk {

struct RewardsConfig {
  std::string funcs;    // align.reward_funcs: "accuracy,format" (names below)
  std::string weights;  // align.reward_weights: "1,0.1" ("" = 1 each)
  AccuracyRewardOptions accuracy;
  std::string format_pattern = kThinkAnswerFormat;
  LengthRewardOptions length;
  std::string command;  // align.reward_command
  std::string url;      // align.reward_url
  double timeout_s = 60;

  // Resolved by check(): one name and weight per function, in order.
  std::vector<std::string> names;
  std::vector<double> weight_values;

  void bind(ConfigBinder& b);
  // nk::Error naming the key for a bad value: no function or an unknown or
  // repeated one, a weight count other than the functions', a weight that is
  // not a finite number, a listed function without its settings (command,
  // url), a pattern that does not compile, a timeout <= 0.
  void check();
};

// The reward function names align.reward_funcs takes.
const std::vector<std::string>& reward_function_names();

}  // namespace nk
