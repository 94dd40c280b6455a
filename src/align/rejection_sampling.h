// Rejection sampling (best-of-n), as NeMo-Aligner's RS and TRL's
// BestOfNSampler: for every prompt, n samples from the policy through the
// batched Generator, each (prompt, sample) scored by a reward model, the best
// (top_n, at or above a threshold) kept as SFT data that `nekton finetune`
// reads:
//   chat prompt    {"messages": [...prompt, {"role": "assistant", "content": SAMPLE}], "reward": R}
//   string prompt  {"input": PROMPT, "output": SAMPLE, "reward": R}   (NeMo's SFT form)
// and beside it OUTPUT.stats.jsonl: a first line {"settings": {...}} (what a
// rerun must find unchanged to reuse the files), then one line per prompt
// with its line, every sample and reward, the kept samples' indices, and the
// mean and max reward.
//
// Deterministic for a seed: sample j of prompt i draws from seed + i * n + j,
// and the Generator's sequences do not depend on what shares their batch.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "align/preference_data.h"
#include "infer/sampler.h"
#include "model/transformer.h"

namespace nk {

struct RejectionSamplingOptions {
  int64_t num_rollouts = 4;  // samples per prompt (n)
  int64_t top_n = 1;         // samples kept per prompt, best first
  // Kept only with a reward at or above this (-inf: off).
  double threshold = -std::numeric_limits<double>::infinity();
  int64_t max_tokens = 128;  // new tokens per sample
  SamplingConfig sampling;
  std::vector<std::string> stop;  // generation ends before any of these
  int64_t batch = 8;              // sequences decoded together

  // nk::Error naming the align.* key for a value out of range.
  void check() const;
};

struct PromptRollouts {
  int64_t line = 0;       // the prompt's line in its file
  nlohmann::json prompt;  // a string or messages, as the file holds it
  std::vector<std::string> samples;
  std::vector<std::optional<float>> rewards;  // nullopt: an empty sample (not scored)
  std::vector<int64_t> kept;                  // indices into samples, best first
  double mean = 0, max = 0;                   // over the scored samples (NaN: none)
};

// n samples of each prompt (token ids as the policy's renderer gives them),
// texts in request order: [prompts][n], invalid UTF-8 replaced by U+FFFD. end_ids: ids besides the
// eod that end a sample (a chat model's end-of-turn tokens).
// `first`: the index of prompts[0] in the whole file (its samples' seeds).
std::vector<std::vector<std::string>> generate_rollouts(
    Transformer& policy, const Tokenizer& tok, const std::vector<int32_t>& end_ids,
    const std::vector<std::vector<int32_t>>& prompts, const RejectionSamplingOptions& opt,
    size_t first = 0);

// Rewards of whole sequences, one per sequence (a reward model's one label).
using SequenceScorer =
    std::function<std::vector<float>(const std::vector<std::vector<int32_t>>& sequences)>;

// The kept indices: those with a reward at or above threshold, best first
// (ties: the earlier sample), at most top_n.
std::vector<int64_t> select_rollouts(const std::vector<std::optional<float>>& rewards,
                                     int64_t top_n, double threshold);

// Renders each (prompt, sample) with the reward model's renderer, scores
// them, fills rewards, kept, mean and max. `where(i)` names prompt i
// (PATH:LINE: KEY) in errors: a sequence longer than max_len tokens (the
// reward model's context; 0: no limit) is one, found before any is scored.
void score_rollouts(std::vector<PromptRollouts>& rollouts,
                    const PreferenceRenderer& reward_renderer, const SequenceScorer& score,
                    int64_t top_n, double threshold,
                    const std::function<std::string(size_t)>& where, int64_t max_len = 0);

// kept, mean and max of a prompt whose rewards are in.
void settle_rollouts(PromptRollouts& r, int64_t top_n, double threshold);

// An interrupted run's progress, OUTPUT.partial.jsonl: a first line
// {"settings": ...}, then one line per finished prompt, in order,
// {"samples": [...], "rewards": [...]}, appended and flushed to disk after
// each chunk of prompts is scored. Samples depend only on the seed and their
// index, so a rerun that starts after the last whole line writes what an
// uninterrupted run would.
std::string rejection_progress_path(const std::string& output);
// The finished prompts' samples and rewards (at most max_prompts; line and
// prompt left for the caller), or none when the file is missing or was made
// with other settings.
std::vector<PromptRollouts> read_rejection_progress(const std::string& output,
                                                    const nlohmann::json& settings,
                                                    size_t max_prompts);
// Appends `done` (starting the file with the settings when `fresh`).
// nk::Error naming the file when it cannot be written.
void append_rejection_progress(const std::string& output, const nlohmann::json& settings,
                               bool fresh, const std::vector<PromptRollouts>& done);

// The SFT record of a kept sample (see above).
nlohmann::ordered_json rejection_sft_record(const nlohmann::json& prompt, const std::string& sample,
                                            float reward);

struct RejectionSamplingSummary {
  int64_t prompts = 0, samples = 0, scored = 0, kept = 0;
  double mean_reward = 0, mean_max_reward = 0, mean_kept_reward = 0;
  std::string line() const;  // for the log
};
RejectionSamplingSummary summarize(const std::vector<PromptRollouts>& rollouts);

// Writes OUTPUT (the SFT JSONL) and OUTPUT.stats.jsonl, each atomically
// (a failure leaves neither a partial file nor, for the SFT file, a new one
// without its stats). nk::Error naming `key` when nothing is kept.
void write_rejection_sampling(const std::string& output, const std::string& key,
                              const std::vector<PromptRollouts>& rollouts,
                              const nlohmann::json& settings);

// The stats file of OUTPUT.
std::string rejection_stats_path(const std::string& output);

// True when OUTPUT and its stats exist and the stats' settings equal
// `settings` (a rerun then reuses them).
bool rejection_sampling_done(const std::string& output, const nlohmann::json& settings);

}  // namespace nk
