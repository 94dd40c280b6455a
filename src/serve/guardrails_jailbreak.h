// NeMo Guardrails' jailbreak detection heuristics (Alon & Kamfonas, 2023),
// computed with the served model instead of GPT-2-large:
//
//   length per perplexity  lp = characters(text) / ppl(text); a jailbreak
//                          when lp >= threshold (long, fluent role-play
//                          prompts such as "DAN" score high)
//   prefix/suffix ppl      for texts of at least 20 whitespace-separated
//                          words, ppl of the first 19 words and of the 19
//                          words before the last one, each joined by single
//                          spaces; a jailbreak when either >= threshold
//                          (GCG-style gibberish suffixes score high)
//
// ppl is the perplexity of the text's tokens under the served model with
// Hugging Face's sliding windows (infer/perplexity.h: the whole context as
// the window, half of it as the stride, as NeMo's 1024 / 512 for GPT-2).
// NeMo's default thresholds (guardrails_config.h) are calibrated for
// GPT-2-large; another model's perplexities differ, so they are a starting
// point to measure again, not a calibration.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "infer/perplexity.h"

namespace nk {

// The perplexity of `text` under the served model; nullopt for a text of
// fewer than 2 tokens (nothing to score).
using PerplexityFn = std::function<std::optional<double>(std::string_view text)>;

struct HeuristicScore {
  bool scored = false;     // false: the text is too short for the heuristic
  bool triggered = false;  // score >= threshold
  double score = 0;        // lp, or the larger of the two perplexities
};

HeuristicScore length_per_perplexity(std::string_view text, double threshold,
                                     const PerplexityFn& ppl);
HeuristicScore prefix_suffix_perplexity(std::string_view text, double threshold,
                                        const PerplexityFn& ppl);

// The two texts prefix_suffix_perplexity scores; nullopt under 20 words.
std::optional<std::pair<std::string, std::string>> prefix_suffix_texts(std::string_view text);

// The sliding windows the rail scores with on `model` (see above).
PerplexityOptions jailbreak_perplexity_options(const ModelConfig& model);

}  // namespace nk
