#include "align/steerlm.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json.h"
#include "data/chat/chat_config.h"
#include "data/dataset/text_dataset.h"

namespace nk {

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::string rendered(const SteerLmSpec& spec, const std::string& attributes) {
  std::string t = spec.prompt_template;
  const std::string tag = "{attributes}";
  for (size_t at = t.find(tag); at != std::string::npos; at = t.find(tag, at + attributes.size()))
    t.replace(at, tag.size(), attributes);
  return t;
}

// The system message's text: the label, then the prompt's own system text
// (if `own`) on the next line.
std::string system_text(const std::string& label, const std::string* own) {
  return own ? label + "\n" + *own : label;
}

}  // namespace

std::vector<std::string> helpsteer_attributes() {
  return {"helpfulness", "correctness", "coherence", "complexity", "verbosity"};
}

std::vector<std::string> split_attribute_names(const std::string& list) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= list.size()) {
    size_t end = list.find(',', at);
    if (end == std::string::npos) end = list.size();
    const std::string name = trim(list.substr(at, end - at));
    if (!name.empty()) out.push_back(name);
    at = end + 1;
  }
  return out;
}

void SteerLmSpec::check(const std::string& key) const {
  if (names.empty()) fail("{}: no attribute names", key);
  std::set<std::string> seen;
  for (const std::string& n : names) {
    if (n.empty()) fail("{}: an empty attribute name", key);
    if (n.find_first_of(":, \t\r\n") != std::string::npos)
      fail("{}: attribute name '{}' holds ':', ',' or white space", key, n);
    if (!seen.insert(n).second) fail("{}: attribute '{}' named twice", key, n);
  }
  if (min_value > max_value)
    fail("{}: the value range [{}, {}] is empty", key, min_value, max_value);
  if (prompt_template.find("{attributes}") == std::string::npos)
    fail("{}: the template '{}' has no {{attributes}}", key, prompt_template);
}

nlohmann::json SteerLmSpec::to_json() const {
  return {
      {"attributes", names}, {"min", min_value}, {"max", max_value}, {"template", prompt_template}};
}

SteerLmSpec SteerLmSpec::from_json(const nlohmann::json& j, const std::string& where) {
  SteerLmSpec s;
  try {
    s.names = j.at("attributes").get<std::vector<std::string>>();
    s.min_value = j.at("min").get<int64_t>();
    s.max_value = j.at("max").get<int64_t>();
    s.prompt_template = j.at("template").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not a SteerLM spec (attributes, min, max, template): {}", where, e.what());
  }
  s.check(where);
  return s;
}

std::string attribute_string(const SteerLmSpec& spec, const std::vector<int64_t>& values) {
  NK_CHECK(values.size() == spec.names.size(), "attribute_string: {} values for {} names",
           values.size(), spec.names.size());
  std::string s;
  for (size_t i = 0; i < values.size(); ++i)
    s += fmt::format("{}{}:{}", i ? "," : "", spec.names[i], values[i]);
  return s;
}

std::vector<std::optional<int64_t>> parse_attribute_string(const SteerLmSpec& spec,
                                                           const std::string& s,
                                                           const std::string& where,
                                                           bool allow_missing) {
  std::vector<std::optional<int64_t>> v(spec.names.size());
  size_t at = 0;
  while (at <= s.size()) {
    size_t end = s.find(',', at);
    if (end == std::string::npos) end = s.size();
    const std::string item = trim(s.substr(at, end - at));
    at = end + 1;
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    if (colon == std::string::npos) fail("{}: '{}' is not NAME:VALUE (in '{}')", where, item, s);
    const std::string name = trim(item.substr(0, colon)), value = trim(item.substr(colon + 1));
    size_t k = 0;
    while (k < spec.names.size() && spec.names[k] != name) ++k;
    if (k == spec.names.size())
      fail("{}: unknown attribute '{}'; the attributes are {}", where, name,
           fmt::join(spec.names, ", "));
    if (v[k]) fail("{}: attribute '{}' given twice", where, name);
    int64_t x = 0;
    size_t used = 0;
    try {
      x = std::stoll(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (value.empty() || used != value.size())
      fail("{}: {}: '{}' is not an integer", where, name, value);
    if (x < spec.min_value || x > spec.max_value)
      fail("{}: {}: {} is outside [{}, {}]", where, name, x, spec.min_value, spec.max_value);
    v[k] = x;
  }
  if (!allow_missing)
    for (size_t k = 0; k < v.size(); ++k)
      if (!v[k]) fail("{}: attribute '{}' has no value (in '{}')", where, spec.names[k], s);
  return v;
}

int64_t attribute_value(const SteerLmSpec& spec, double score) {
  if (!std::isfinite(score)) fail("attribute model: a score of {}", score);
  const double r = std::round(score);
  if (r <= double(spec.min_value)) return spec.min_value;
  if (r >= double(spec.max_value)) return spec.max_value;
  return int64_t(r);
}

nlohmann::json steerlm_prompt(const SteerLmSpec& spec, const std::string& attributes,
                              const nlohmann::json& prompt, const std::string& where) {
  const std::string label = rendered(spec, attributes);
  if (prompt.is_string()) return label + "\n" + prompt.get<std::string>();
  if (!prompt.is_array() || prompt.empty())
    fail("{}: must be a string or a non-empty list of messages, not {}", where, prompt.type_name());
  nlohmann::json out = nlohmann::json::array();
  const nlohmann::json& first = prompt[0];
  if (first.is_object() && first.value("role", "") == "system" && first.contains("content") &&
      first["content"].is_string()) {
    nlohmann::json sys = first;
    sys["content"] = system_text(label, &first["content"].get_ref<const std::string&>());
    out.push_back(sys);
    for (size_t i = 1; i < prompt.size(); ++i) out.push_back(prompt[i]);
  } else {
    out.push_back({{"role", "system"}, {"content", system_text(label, nullptr)}});
    for (const auto& m : prompt) out.push_back(m);
  }
  return out;
}

std::vector<ChatMessage> steerlm_messages(const SteerLmSpec& spec, const std::string& attributes,
                                          const std::vector<ChatMessage>& messages) {
  const std::string label = rendered(spec, attributes);
  std::vector<ChatMessage> out;
  // A system message with only tool calls' null content is no text to extend.
  const bool own = !messages.empty() && messages[0].role == "system" &&
                   !(messages[0].extra.is_object() && messages[0].extra.contains("content"));
  if (own) {
    out.push_back(messages[0]);
    out[0].content = system_text(label, &messages[0].content);
  } else {
    out.push_back({"system", system_text(label, nullptr)});
  }
  out.insert(out.end(), messages.begin() + (own ? 1 : 0), messages.end());
  return out;
}

std::optional<SteerLmSpec> read_steerlm_spec(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "steerlm.json").string();
  if (model_dir.empty() || !std::filesystem::is_regular_file(path)) return std::nullopt;
  return SteerLmSpec::from_json(parse_json_object(read_text_file(path), path), path);
}

nlohmann::json steerlm_condition(const SteerLmSpec& spec, const std::string& values,
                                 const nlohmann::json& prompt, const std::string& key) {
  std::vector<int64_t> v;
  for (const auto& x : parse_attribute_string(spec, values, key)) v.push_back(*x);
  return steerlm_prompt(spec, attribute_string(spec, v), prompt, key);
}

SteerLmSpec steerlm_spec_for(const std::string& model_dir, const std::string& values,
                             const std::string& prompt_template, const std::string& key) {
  std::optional<SteerLmSpec> spec = read_steerlm_spec(model_dir);
  if (!spec) {
    spec.emplace();
    for (const std::string& item : split_attribute_names(values))
      spec->names.push_back(trim(item.substr(0, item.find(':'))));
    spec->min_value = std::numeric_limits<int32_t>::min();
    spec->max_value = std::numeric_limits<int32_t>::max();
  }
  if (!prompt_template.empty()) spec->prompt_template = prompt_template;
  spec->check(key);
  return *spec;
}

}  // namespace nk
