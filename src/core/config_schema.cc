// ConfigSchema: key table, nearest-key suggestions and the --help listing.
#include <fmt/format.h>

#include <algorithm>

#include "core/config.h"
#include "core/error.h"

namespace nk {

const char* config_type_name(ConfigType t) {
  switch (t) {
    case ConfigType::Int:
      return "int";
    case ConfigType::Float:
      return "float";
    case ConfigType::Bool:
      return "bool";
    case ConfigType::String:
      return "string";
  }
  return "?";
}

std::string config_value_str(const ConfigValue& v) {
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  // Shortest text that reads back to the same double; keep it visibly a float.
  std::string s = fmt::format("{}", std::get<double>(v));
  if (s.find_first_of(".eEni") == std::string::npos) s += ".0";
  return s;
}

ConfigSchema& ConfigSchema::add(const std::string& key, ConfigType type, ConfigValue def,
                                const std::string& doc) {
  NK_CHECK(!key.empty() && key.front() != '.' && key.back() != '.' &&
               key.find("..") == std::string::npos && key.find('=') == std::string::npos,
           "bad config key '{}'", key);
  NK_CHECK(!has(key), "config key '{}' declared twice", key);
  // A key cannot also be a section ("model" and "model.n_layer"): YAML could not hold both.
  NK_CHECK(!is_section(key), "config key '{}' is also a section", key);
  for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1))
    NK_CHECK(!has(key.substr(0, dot)), "config key '{}' is inside key '{}'", key,
             key.substr(0, dot));
  by_key_[key] = fields_.size();
  fields_.push_back({key, type, std::move(def), doc});
  return *this;
}

ConfigSchema& ConfigSchema::add_int(const std::string& key, int64_t def, const std::string& doc) {
  return add(key, ConfigType::Int, def, doc);
}
ConfigSchema& ConfigSchema::add_float(const std::string& key, double def, const std::string& doc) {
  return add(key, ConfigType::Float, def, doc);
}
ConfigSchema& ConfigSchema::add_bool(const std::string& key, bool def, const std::string& doc) {
  return add(key, ConfigType::Bool, def, doc);
}
ConfigSchema& ConfigSchema::add_string(const std::string& key, const std::string& def,
                                       const std::string& doc) {
  return add(key, ConfigType::String, def, doc);
}

bool ConfigSchema::has(const std::string& key) const {
  return by_key_.count(key) != 0;
}

bool ConfigSchema::is_section(const std::string& prefix) const {
  auto it = by_key_.lower_bound(prefix + ".");
  return it != by_key_.end() && it->first.compare(0, prefix.size() + 1, prefix + ".") == 0;
}

size_t ConfigSchema::index(const std::string& key) const {
  auto it = by_key_.find(key);
  NK_CHECK(it != by_key_.end(), "config key '{}' is not in the schema", key);
  return it->second;
}

static size_t levenshtein(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

static std::string last_component(const std::string& key) {
  size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

std::string ConfigSchema::nearest_key(const std::string& key) const {
  // "Plausibly close": about one edit in three characters, at least one edit
  // (two for the whole key, which carries a section name too).
  std::string last = last_component(key);
  size_t full_budget = std::max<size_t>(2, key.size() / 3);
  size_t last_budget = std::max<size_t>(1, last.size() / 3);
  std::string best;
  std::pair<size_t, size_t> best_score{SIZE_MAX, SIZE_MAX};
  for (const Field& f : fields_) {
    size_t d_full = levenshtein(key, f.key);
    size_t d_last = levenshtein(last, last_component(f.key));
    if (d_full > full_budget && d_last > last_budget) continue;
    // Rank by the better of the two distances; the whole-key distance breaks ties
    // ("model.lr" prefers "optim.lr" over "train.lr" only if it is closer overall).
    std::pair<size_t, size_t> score{std::min(d_full, d_last), d_full};
    if (score < best_score) best_score = score, best = f.key;
  }
  return best;
}

static std::string section_of(const std::string& key) {
  size_t dot = key.find('.');
  return dot == std::string::npos ? "" : key.substr(0, dot);
}

std::string ConfigSchema::help() const {
  size_t wkey = 3, wtype = 4, wdef = 7;
  std::vector<std::string> defs;
  for (const Field& f : fields_) {
    std::string d = config_value_str(f.def);
    if (f.type == ConfigType::String) d = "'" + d + "'";
    wkey = std::max(wkey, f.key.size());
    wtype = std::max(wtype, std::string(config_type_name(f.type)).size());
    wdef = std::max(wdef, d.size());
    defs.push_back(std::move(d));
  }
  // Sections in order of first appearance; keys keep declaration order within one.
  std::vector<std::string> sections;
  for (const Field& f : fields_) {
    std::string s = section_of(f.key);
    if (std::find(sections.begin(), sections.end(), s) == sections.end()) sections.push_back(s);
  }
  std::string out = fmt::format("  {:<{}}  {:<{}}  {:<{}}  {}\n", "key", wkey, "type", wtype,
                                "default", wdef, "description");
  for (const std::string& s : sections) {
    out += s.empty() ? "\n" : fmt::format("\n{}:\n", s);
    for (size_t i = 0; i < fields_.size(); ++i) {
      const Field& f = fields_[i];
      if (section_of(f.key) != s) continue;
      out += fmt::format("  {:<{}}  {:<{}}  {:<{}}  {}\n", f.key, wkey, config_type_name(f.type),
                         wtype, defs[i], wdef, f.doc);
    }
  }
  return out;
}

}  // namespace nk
