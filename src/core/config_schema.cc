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

void ConfigSchema::check_new_name(const std::string& key) const {
  NK_CHECK(!key.empty() && key.front() != '.' && key.back() != '.' &&
               key.find("..") == std::string::npos && key.find('=') == std::string::npos,
           "bad config key '{}'", key);
  NK_CHECK(resolve(key).empty(), "config key '{}' declared twice", key);
  // A key cannot also be a section ("model" and "model.n_layer"): YAML could not hold both.
  NK_CHECK(!is_section(key), "config key '{}' is also a section", key);
  for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1))
    NK_CHECK(resolve(key.substr(0, dot)).empty(), "config key '{}' is inside key '{}'", key,
             key.substr(0, dot));
}

ConfigSchema& ConfigSchema::add(const std::string& key, ConfigType type, ConfigValue def,
                                const std::string& doc) {
  check_new_name(key);
  NK_CHECK(def.index() == size_t(type), "config key '{}': default of another type", key);
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

ConfigSchema& ConfigSchema::add_alias(const std::string& old_name, const std::string& key) {
  check_new_name(old_name);
  NK_CHECK(has(key), "config alias '{}' of undeclared key '{}'", old_name, key);
  aliases_[old_name] = key;
  return *this;
}

bool ConfigSchema::has(const std::string& key) const {
  return by_key_.count(key) != 0;
}

std::string ConfigSchema::resolve(const std::string& name) const {
  if (has(name)) return name;
  auto it = aliases_.find(name);
  return it == aliases_.end() ? "" : it->second;
}

bool ConfigSchema::is_section(const std::string& prefix) const {
  auto starts = [&](const auto& names) {
    auto it = names.lower_bound(prefix + ".");
    return it != names.end() && it->first.compare(0, prefix.size() + 1, prefix + ".") == 0;
  };
  return starts(by_key_) || starts(aliases_);
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
  struct Row {
    std::string key, type, def, doc;
  };
  std::vector<Row> rows;
  for (const Field& f : fields_) {
    std::string d = config_value_str(f.def);
    if (f.type == ConfigType::String) d = "'" + d + "'";
    rows.push_back({f.key, config_type_name(f.type), d, f.doc});
  }
  for (const auto& [old_name, key] : aliases_) {
    const Row& r = rows[index(key)];
    rows.push_back({old_name, r.type, r.def, fmt::format("older name of {}", key)});
  }
  size_t wkey = 3, wtype = 4, wdef = 7;
  for (const Row& r : rows) {
    wkey = std::max(wkey, r.key.size());
    wtype = std::max(wtype, r.type.size());
    wdef = std::max(wdef, r.def.size());
  }
  // Sections in order of first appearance; keys keep declaration order within
  // one, older names after them.
  std::vector<std::string> sections;
  for (const Row& r : rows) {
    std::string s = section_of(r.key);
    if (std::find(sections.begin(), sections.end(), s) == sections.end()) sections.push_back(s);
  }
  std::string out = fmt::format("  {:<{}}  {:<{}}  {:<{}}  {}\n", "key", wkey, "type", wtype,
                                "default", wdef, "description");
  for (const std::string& s : sections) {
    out += s.empty() ? "\n" : fmt::format("\n{}:\n", s);
    for (const Row& r : rows)
      if (section_of(r.key) == s)
        out += fmt::format("  {:<{}}  {:<{}}  {:<{}}  {}\n", r.key, wkey, r.type, wtype, r.def,
                           wdef, r.doc);
  }
  return out;
}

}  // namespace nk
