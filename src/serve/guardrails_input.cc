#include "serve/guardrails_input.h"

#include <fmt/format.h>

#include "curate/classify/fasttext_model.h"
#include "curate/words.h"

namespace nk {

InputRails::InputRails(const GuardrailsConfig& c) : cfg_(c.input) {
  const GuardrailsConfig::Input& in = cfg_;
  if (in.max_chars > 0) rails_.push_back({Kind::MaxChars, "input.max_chars"});
  if (in.max_tokens > 0) rails_.push_back({Kind::MaxTokens, "input.max_tokens"});
  keywords_ = compile_rail_patterns(c, "input.blocked_keywords", in.blocked_keywords, true);
  if (!keywords_.empty()) rails_.push_back({Kind::Keywords, "input.blocked_keywords"});
  regex_ = compile_rail_patterns(c, "input.blocked_regex", in.blocked_regex, false);
  if (!regex_.empty()) rails_.push_back({Kind::Regex, "input.blocked_regex"});
  if (!in.classifier_model.empty()) {
    try {
      classifier_ = std::make_unique<curate::FastTextModel>(in.classifier_model);
    } catch (const Error& e) {
      c.fail_at("input.classifier.model", e.what());
    }
    for (size_t i = 0; i < in.classifier_labels.size(); ++i) {
      const std::string& l = in.classifier_labels[i];
      int k = classifier_->label_index(l);
      if (k < 0) k = classifier_->label_index("__label__" + l);
      if (k < 0)
        c.fail_at("input.classifier.labels",
                  fmt::format("the model {} has no label '{}' (its labels: {})",
                              in.classifier_model, l, fmt::join(classifier_->labels(), ", ")),
                  int64_t(i));
      labels_.push_back(k);
    }
    rails_.push_back({Kind::Classifier, "input.classifier"});
  }
  if (in.length_per_perplexity)
    rails_.push_back({Kind::LengthPerPpl, "input.jailbreak_length_per_perplexity"});
  if (in.prefix_suffix_perplexity)
    rails_.push_back({Kind::PrefixSuffixPpl, "input.jailbreak_prefix_suffix_perplexity"});
}

InputRails::~InputRails() = default;

bool InputRails::needs_perplexity() const {
  for (const Rail& r : rails_)
    if (r.kind == Kind::LengthPerPpl || r.kind == Kind::PrefixSuffixPpl) return true;
  return false;
}

std::vector<std::string> InputRails::names() const {
  std::vector<std::string> out;
  for (const Rail& r : rails_) out.push_back(r.name);
  return out;
}

std::string InputRails::judge(const Rail& r, const std::string& text, const Tokenizer& tok,
                              const PerplexityFn& ppl) const {
  switch (r.kind) {
    case Kind::MaxChars: {
      const size_t n = curate::utf8_length(text);
      return int64_t(n) > cfg_.max_chars ? fmt::format("{} characters, over {}", n, cfg_.max_chars)
                                         : "";
    }
    case Kind::MaxTokens: {
      const size_t n = tok.encode(text).size();
      return int64_t(n) > cfg_.max_tokens ? fmt::format("{} tokens, over {}", n, cfg_.max_tokens)
                                          : "";
    }
    case Kind::Keywords:
    case Kind::Regex: {
      const PatternList& l = r.kind == Kind::Keywords ? keywords_ : regex_;
      std::vector<TextSpan> spans;
      if (!l.find_all(text, 0, spans)) return "a pattern hit PCRE2's match limit";
      return spans.empty() ? "" : fmt::format("item {} matched", spans.front().index);
    }
    case Kind::Classifier:
      for (size_t i = 0; i < labels_.size(); ++i) {
        const double p = classifier_->label_prob(text, labels_[i]);
        if (p >= cfg_.classifier_threshold)
          return fmt::format("{} with probability {:.3f}",
                             classifier_->labels()[size_t(labels_[i])], p);
      }
      return "";
    case Kind::LengthPerPpl: {
      const HeuristicScore s =
          length_per_perplexity(text, cfg_.length_per_perplexity_threshold, ppl);
      return s.triggered ? fmt::format("length per perplexity {:.2f}", s.score) : "";
    }
    case Kind::PrefixSuffixPpl: {
      const HeuristicScore s =
          prefix_suffix_perplexity(text, cfg_.prefix_suffix_perplexity_threshold, ppl);
      return s.triggered ? fmt::format("prefix/suffix perplexity {:.2f}", s.score) : "";
    }
  }
  return "";
}

InputVerdict InputRails::check(const std::vector<std::string>& texts, const Tokenizer& tok,
                               const PerplexityFn& ppl, ServeMetrics* metrics) const {
  for (const Rail& r : rails_) {
    if (metrics) metrics->guardrail_checks.inc(1, {{"rail", r.name}});
    for (const std::string& text : texts) {
      std::string why = judge(r, text, tok, ppl);
      if (why.empty()) continue;
      if (metrics) metrics->guardrail_triggered.inc(1, {{"rail", r.name}});
      return {r.name, std::move(why)};
    }
  }
  return {};
}

}  // namespace nk
