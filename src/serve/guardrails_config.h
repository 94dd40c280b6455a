// The guardrails file of `nekton serve` (serve.guardrails.config=FILE.yaml),
// in the spirit of NeMo Guardrails' config folder: which rails stand in front
// of the model and their settings. A file of its own because its keys take
// lists (keywords, patterns, labels) that a command-line key cannot carry.
//
//   refusal: "I'm sorry, I can't respond to that."
//   on_input: refuse            # or error (HTTP 400, code content_filter)
//   input:
//     messages: last_user       # chat messages checked: last_user, user, all
//     max_chars: 4000           # 0: no limit
//     max_tokens: 0
//     blocked_keywords: [...]   # case-insensitive whole words or phrases
//     blocked_regex: [...]      # PCRE2 patterns
//     classifier: {model: FILE.bin, labels: [...], threshold: 0.5}
//     jailbreak: {length_per_perplexity: true, prefix_suffix_perplexity: true, ...}
//   output:
//     pii: [email, phone, ...]  # curate's PII scanner; "all" for every type
//     pii_placeholder: ""       # "": typed placeholders (<EMAIL>, ...)
//     blocked_words: [...]
//     blocked_regex: [...]
//     blocked_action: mask      # or refuse
//     mask: "***"
//     window: 256               # characters held back while streaming
//
// Every key is bound in one line (core/config_bind.h) through curate's
// YamlKeys: a wrong type, an unknown key (naming the nearest one) or a bad
// value is an nk::Error naming the file, the line and the key.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace nk {

// NeMo Guardrails' jailbreak heuristics thresholds, calibrated there with
// GPT-2-large as the scoring model: with another model the numbers mean
// something else and should be measured again.
inline constexpr double kNemoLengthPerPerplexity = 89.79;
inline constexpr double kNemoPrefixSuffixPerplexity = 1845.65;

struct GuardrailsConfig {
  std::string file;  // for messages; "" when built in code
  std::string refusal = "I'm sorry, I can't respond to that.";
  std::string on_input = "refuse";  // refuse | error

  struct Input {
    std::string messages = "last_user";  // last_user | user | all
    int64_t max_chars = 0;               // code points of one checked text; 0: off
    int64_t max_tokens = 0;              // tokens of one checked text; 0: off
    std::vector<std::string> blocked_keywords, blocked_regex;
    std::string classifier_model;  // fastText (`nekton curate train-classifier`); "": off
    std::vector<std::string> classifier_labels;
    double classifier_threshold = 0.5;
    bool length_per_perplexity = false;
    double length_per_perplexity_threshold = kNemoLengthPerPerplexity;
    bool prefix_suffix_perplexity = false;
    double prefix_suffix_perplexity_threshold = kNemoPrefixSuffixPerplexity;
  } input;

  struct Output {
    std::vector<std::string> pii;  // curate's type names, or "all"
    std::string pii_placeholder;   // "": the typed ones
    std::vector<std::string> blocked_words, blocked_regex;
    std::string blocked_action = "mask";  // mask | refuse
    std::string mask = "***";
    int64_t window = 256;  // code points
  } output;

  // "FILE:LINE: key 'KEY'" (item INDEX when >= 0), where the file gave it;
  // for messages about a value that parsed but cannot be used.
  std::string place(const std::string& key, int64_t index = -1) const;
  [[noreturn]] void fail_at(const std::string& key, const std::string& msg,
                            int64_t index = -1) const;

  // Lines of the keys and list items as the file gave them (read_guardrails_config).
  std::map<std::string, int64_t> key_lines;
  std::map<std::string, std::vector<int64_t>> item_lines;
};

// Reads and checks a guardrails file: types, unknown keys, choices and
// ranges. Compiling the patterns and opening the classifier is the rails'
// part (Guardrails), which names the same places through fail_at.
GuardrailsConfig read_guardrails_config(const std::string& path);

}  // namespace nk
