// What the reward functions of online RL (GRPO, RLOO) score and answer: one
// rollout (a prompt's record, the prompt, one sampled completion) in, one
// number per reward function and their weighted sum out.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace nk {

// Built positionally, trailing fields optional: RewardInput{&record, &prompt,
// text, tokens, truncated, "data.jsonl:7"} (a constructor rather than an
// aggregate, so that leaving fields out is not a -Wmissing-field-initializers
// error).
struct RewardInput {
  const nlohmann::json* record = nullptr;  // the prompt's JSONL record as read (extra
                                           // fields such as "answer"/"solution" live here)
  const nlohmann::json* prompt = nullptr;  // its prompt: a string or a chat `messages` array
  std::string completion;  // the sampled text (policy tokenizer's decode, stop strings cut)
  int64_t completion_tokens = 0;
  bool truncated = false;  // ended at the max completion length (no eos / stop)
  std::string where;       // names it in errors ("PATH:LINE"; "" = "rollout I" alone)

  RewardInput() = default;
  RewardInput(const nlohmann::json* record_, const nlohmann::json* prompt_, std::string completion_,
              int64_t completion_tokens_ = 0, bool truncated_ = false, std::string where_ = "")
      : record(record_),
        prompt(prompt_),
        completion(std::move(completion_)),
        completion_tokens(completion_tokens_),
        truncated(truncated_),
        where(std::move(where_)) {}
};

struct RewardScores {
  std::vector<double> total;  // [n]: sum_i weight_i * part_i
  struct Part {
    std::string name;
    double weight = 1;
    bool verifiable = false;     // a checked answer (accuracy): its mean is an accuracy
    std::vector<double> values;  // [n], unweighted
  };
  std::vector<Part> parts;  // one per reward function, in align.reward_funcs order
};

// How errors name rollout `i` of a batch.
std::string rollout_name(std::span<const RewardInput> in, size_t i);

// The object an external grader (align.reward_command, align.reward_url)
// receives for a rollout: the record's fields, then "prompt", "completion",
// "completion_tokens" and "truncated" (these four replace record fields of
// the same names).
nlohmann::json grader_input(const RewardInput& in);

// A grader's answer for one rollout: a number, or an object {"reward": x}.
// nk::Error (saying what it got) for anything else or a non-finite number.
double grader_reward(const nlohmann::json& v);

}  // namespace nk
