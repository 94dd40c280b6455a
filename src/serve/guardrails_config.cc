#include "serve/guardrails_config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "curate/filters/pii.h"
#include "curate/yaml_keys.h"

namespace nk {

namespace {

void bind_rails(curate::YamlKeys& k, GuardrailsConfig& c) {
  k.bind("refusal", c.refusal, "the assistant's answer when a rail refuses");
  k.bind("on_input", c.on_input,
         "a triggered input rail: refuse (HTTP 200, the refusal as the message, finish_reason "
         "content_filter) or error (HTTP 400, code content_filter)");
  GuardrailsConfig::Input& in = c.input;
  k.bind("input.messages", in.messages,
         "chat messages the input rails check: last_user (NeMo's user input), user, all");
  k.bind("input.max_chars", in.max_chars, "most characters of one checked text (0: no limit)");
  k.bind("input.max_tokens", in.max_tokens, "most tokens of one checked text (0: no limit)");
  k.bind("input.blocked_keywords", in.blocked_keywords,
         "words or phrases refused anywhere in a checked text (case-insensitive, whole words)");
  k.bind("input.blocked_regex", in.blocked_regex,
         "PCRE2 patterns refused anywhere in a checked text ((?i) for any case)");
  k.bind("input.classifier.model", in.classifier_model,
         "fastText model from `nekton curate train-classifier` (\"\": no classifier rail)");
  k.bind("input.classifier.labels", in.classifier_labels,
         "labels refused (as the model names them; __label__ may be left out)");
  k.bind("input.classifier.threshold", in.classifier_threshold,
         "refused when a label's probability is at least this, in [0, 1]");
  k.bind("input.jailbreak.length_per_perplexity", in.length_per_perplexity,
         "NeMo's heuristic: characters / perplexity under the served model >= threshold");
  k.bind("input.jailbreak.length_per_perplexity_threshold", in.length_per_perplexity_threshold,
         "NeMo's default (89.79) is calibrated for GPT-2-large");
  k.bind("input.jailbreak.prefix_suffix_perplexity", in.prefix_suffix_perplexity,
         "NeMo's heuristic: perplexity of the first or last 19 of 20+ words >= threshold");
  k.bind("input.jailbreak.prefix_suffix_perplexity_threshold",
         in.prefix_suffix_perplexity_threshold,
         "NeMo's default (1845.65) is calibrated for GPT-2-large");
  GuardrailsConfig::Output& out = c.output;
  k.bind("output.pii", out.pii,
         "PII redacted from answers with curate's scanner: email, phone, ssn, credit_card, "
         "ip_address, url_with_credentials, or all");
  k.bind("output.pii_placeholder", out.pii_placeholder,
         "what replaces PII (\"\": the typed placeholders of curate's pii stage, <EMAIL>, ...)");
  k.bind("output.blocked_words", out.blocked_words,
         "words or phrases blocked in answers (case-insensitive, whole words)");
  k.bind("output.blocked_regex", out.blocked_regex, "PCRE2 patterns blocked in answers");
  k.bind("output.blocked_action", out.blocked_action,
         "a blocked word or pattern in an answer: mask (replaced by `mask`) or refuse (the "
         "answer ends with the refusal, finish_reason content_filter)");
  k.bind("output.mask", out.mask, "what replaces a blocked word with blocked_action mask");
  k.bind("output.window", out.window,
         "characters of a streamed answer held back until no pattern can still match them "
         "(at least the longest match)");
}

// curate's YamlKeys, with the lines of what the file gave, for later messages.
class RailsKeys : public curate::YamlKeys {
 public:
  using YamlKeys::YamlKeys;
  void record(GuardrailsConfig& c) const {
    for (const ConfigSchema::Field& f : schema().fields()) {
      const YAML::Node n = node(f.key);
      if (!n) continue;
      if (!n.Mark().is_null()) c.key_lines[f.key] = n.Mark().line + 1;
      if (!n.IsSequence()) continue;
      std::vector<int64_t>& lines = c.item_lines[f.key];
      for (const YAML::Node& item : n)
        lines.push_back(item.Mark().is_null() ? 0 : item.Mark().line + 1);
    }
  }
};

void one_of(const GuardrailsConfig& c, const std::string& key, const std::string& v,
            std::initializer_list<const char*> choices) {
  for (const char* x : choices)
    if (v == x) return;
  c.fail_at(key, fmt::format("'{}' is not one of: {}", v, fmt::join(choices, ", ")));
}

void no_empty_items(const GuardrailsConfig& c, const std::string& key,
                    const std::vector<std::string>& items) {
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].find_first_not_of(" \t\r\n") == std::string::npos)
      c.fail_at(key, "an empty entry matches nothing", int64_t(i));
}

void check(const GuardrailsConfig& c) {
  one_of(c, "on_input", c.on_input, {"refuse", "error"});
  if (c.refusal.empty()) c.fail_at("refusal", "must not be empty");
  const GuardrailsConfig::Input& in = c.input;
  one_of(c, "input.messages", in.messages, {"last_user", "user", "all"});
  if (in.max_chars < 0) c.fail_at("input.max_chars", "must be >= 0 (0: no limit)");
  if (in.max_tokens < 0) c.fail_at("input.max_tokens", "must be >= 0 (0: no limit)");
  no_empty_items(c, "input.blocked_keywords", in.blocked_keywords);
  no_empty_items(c, "input.blocked_regex", in.blocked_regex);
  if (in.classifier_model.empty() && !in.classifier_labels.empty())
    c.fail_at("input.classifier.labels", "labels given without input.classifier.model");
  if (!in.classifier_model.empty() && in.classifier_labels.empty())
    c.fail_at("input.classifier.labels",
              "the classifier rail needs the labels it refuses (input.classifier.labels)");
  if (!(in.classifier_threshold >= 0 && in.classifier_threshold <= 1))
    c.fail_at("input.classifier.threshold",
              fmt::format("must be in [0, 1], got {}", in.classifier_threshold));
  for (const auto& [key, v] : {std::pair{"input.jailbreak.length_per_perplexity_threshold",
                                         in.length_per_perplexity_threshold},
                               std::pair{"input.jailbreak.prefix_suffix_perplexity_threshold",
                                         in.prefix_suffix_perplexity_threshold}})
    if (!(v > 0 && std::isfinite(v)))
      c.fail_at(key, fmt::format("must be a positive number, got {}", v));
  const GuardrailsConfig::Output& out = c.output;
  for (size_t i = 0; i < out.pii.size(); ++i) {
    curate::PiiType t;
    if (out.pii[i] != "all" && !curate::pii_type_of(out.pii[i], t)) {
      std::vector<std::string> names{"all"};
      for (size_t k = 0; k < curate::kPiiTypes; ++k)
        names.emplace_back(curate::pii_name(curate::PiiType(k)));
      c.fail_at(
          "output.pii",
          fmt::format("unknown PII type '{}' (known: {})", out.pii[i], fmt::join(names, ", ")),
          int64_t(i));
    }
  }
  no_empty_items(c, "output.blocked_words", out.blocked_words);
  no_empty_items(c, "output.blocked_regex", out.blocked_regex);
  one_of(c, "output.blocked_action", out.blocked_action, {"mask", "refuse"});
  if (out.window < 1 || out.window > (1 << 20))
    c.fail_at("output.window", fmt::format("must be in [1, {}], got {}", 1 << 20, out.window));
  // A blocked word longer than the window could be released before it is
  // whole (counted in bytes: never fewer than its characters).
  for (size_t i = 0; i < out.blocked_words.size(); ++i)
    if (int64_t(out.blocked_words[i].size()) >= out.window)
      c.fail_at("output.window",
                fmt::format("{} is shorter than blocked word {} ({} bytes): a streamed answer "
                            "would release it before it is whole",
                            out.window, i, out.blocked_words[i].size()));
}

}  // namespace

std::string GuardrailsConfig::place(const std::string& key, int64_t index) const {
  int64_t line = 0;
  if (index >= 0) {
    auto it = item_lines.find(key);
    if (it != item_lines.end() && size_t(index) < it->second.size()) line = it->second[index];
  }
  if (line == 0) {
    auto it = key_lines.find(key);
    if (it != key_lines.end()) line = it->second;
  }
  const std::string where = file.empty() ? std::string("guardrails")
                            : line > 0   ? fmt::format("{}:{}", file, line)
                                         : file;
  return index >= 0 ? fmt::format("{}: key '{}' item {}", where, key, index)
                    : fmt::format("{}: key '{}'", where, key);
}

void GuardrailsConfig::fail_at(const std::string& key, const std::string& msg,
                               int64_t index) const {
  throw Error(place(key, index) + ": " + msg);
}

GuardrailsConfig read_guardrails_config(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    fail("serve.guardrails.config: cannot read guardrails file '{}'", path);
  } catch (const YAML::Exception& e) {
    fail("{}:{}: invalid YAML: {}", path, e.mark.line + 1, e.msg);
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) fail("{}: the top level must be a map (refusal, input, output, ...)", path);
  GuardrailsConfig c;
  c.file = path;
  RailsKeys keys(root, path);
  bind_rails(keys, c);
  keys.finish();
  keys.record(c);
  check(c);
  return c;
}

}  // namespace nk
