// Input rails: checks on the user's text before the model runs, in order
// (cheap first, the model's perplexity last), stopping at the first that
// triggers (as NeMo Guardrails runs its input flows):
//
//   input.max_chars, input.max_tokens   a text longer than the limit
//   input.blocked_keywords              a keyword or phrase (whole words, any case)
//   input.blocked_regex                 a PCRE2 pattern
//   input.classifier                    a fastText label's probability >= threshold
//   input.jailbreak_length_per_perplexity, input.jailbreak_prefix_suffix_perplexity
//                                       NeMo's heuristics (guardrails_jailbreak.h)
//
// The names are the `rail` label of nekton_guardrail_checks_total and
// nekton_guardrail_triggered_total. Thread-safe: the HTTP threads check
// concurrently.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer/tokenizer.h"
#include "serve/guardrails_config.h"
#include "serve/guardrails_jailbreak.h"
#include "serve/guardrails_patterns.h"
#include "serve/serve_metrics.h"

namespace nk::curate {
class FastTextModel;
}

namespace nk {

// Which rail refused, and why (for the server's log; never sent to the client).
struct InputVerdict {
  std::string rail;  // "" = passed
  std::string detail;
  explicit operator bool() const { return !rail.empty(); }
};

class InputRails {
 public:
  // Compiles the patterns and opens the classifier; nk::Error naming the
  // file, line and key (and item) of anything that cannot be used.
  explicit InputRails(const GuardrailsConfig& c);
  ~InputRails();

  bool empty() const { return rails_.empty(); }
  bool needs_perplexity() const;
  // The rails' names, in the order they run.
  std::vector<std::string> names() const;

  // Runs the rails over `texts` (each text on its own). `ppl` is needed only
  // by the jailbreak rails; `metrics` (optional) counts each rail that ran
  // and the one that triggered.
  InputVerdict check(const std::vector<std::string>& texts, const Tokenizer& tok,
                     const PerplexityFn& ppl, ServeMetrics* metrics) const;

 private:
  enum class Kind {
    MaxChars,
    MaxTokens,
    Keywords,
    Regex,
    Classifier,
    LengthPerPpl,
    PrefixSuffixPpl
  };
  struct Rail {
    Kind kind;
    std::string name;
  };
  // The rail's verdict on one text: "" = passed, else the detail.
  std::string judge(const Rail& r, const std::string& text, const Tokenizer& tok,
                    const PerplexityFn& ppl) const;

  GuardrailsConfig::Input cfg_;
  std::vector<Rail> rails_;
  PatternList keywords_, regex_;
  std::unique_ptr<curate::FastTextModel> classifier_;
  std::vector<int> labels_;  // indices into the classifier's labels
};

}  // namespace nk
