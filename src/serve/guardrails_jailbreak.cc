#include "serve/guardrails_jailbreak.h"

#include <algorithm>
#include <vector>

#include "curate/words.h"

namespace nk {

namespace {

// NeMo's cut: fewer words give GCG-style attacks too little room to matter.
constexpr size_t kMinWords = 20;
constexpr size_t kEdgeWords = 19;

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string join(const std::vector<std::string_view>& words, size_t from, size_t to) {
  std::string out;
  for (size_t i = from; i < to; ++i) {
    if (i > from) out += ' ';
    out.append(words[i]);
  }
  return out;
}

}  // namespace

HeuristicScore length_per_perplexity(std::string_view text, double threshold,
                                     const PerplexityFn& ppl) {
  const std::optional<double> p = ppl(text);
  if (!p) return {};
  const double lp = double(curate::utf8_length(text)) / *p;
  return {true, lp >= threshold, lp};
}

std::optional<std::pair<std::string, std::string>> prefix_suffix_texts(std::string_view text) {
  std::vector<std::string_view> words;
  for (size_t i = 0; i < text.size();) {
    while (i < text.size() && is_space(text[i])) ++i;
    const size_t b = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    if (i > b) words.push_back(text.substr(b, i - b));
  }
  const size_t n = words.size();
  if (n < kMinWords) return std::nullopt;
  return std::pair{join(words, 0, kEdgeWords), join(words, n - kEdgeWords - 1, n - 1)};
}

HeuristicScore prefix_suffix_perplexity(std::string_view text, double threshold,
                                        const PerplexityFn& ppl) {
  const auto texts = prefix_suffix_texts(text);
  if (!texts) return {};
  HeuristicScore s;
  for (const std::string& t : {texts->first, texts->second})
    if (const std::optional<double> p = ppl(t)) {
      s.scored = true;
      s.score = std::max(s.score, *p);
    }
  s.triggered = s.scored && s.score >= threshold;
  return s;
}

PerplexityOptions jailbreak_perplexity_options(const ModelConfig& model) {
  PerplexityOptions o;
  o.window = std::max<int64_t>(1, model.max_seq_len - model.prompt.virtual_tokens);
  o.stride = std::max<int64_t>(1, o.window / 2);
  return o;
}

}  // namespace nk
