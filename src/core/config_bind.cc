// ConfigBinder: declare a key and fill its field in one call.
#include "core/config_bind.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace nk {

bool ConfigBinder::add_key(const std::string& key, ConfigType type, ConfigValue def,
                           const std::string& doc) {
  const std::string* shown = &doc;
  if (selecting_) {
    auto it = std::find_if(only_.begin(), only_.end(), [&](const Pick& p) { return p.key == key; });
    if (it == only_.end()) return false;
    if (!it->doc.empty()) shown = &it->doc;
  }
  schema_.add(key, type, std::move(def), *shown);
  return true;
}

std::optional<GivenValue> ConfigBinder::declare(const std::string& key, ConfigType type,
                                                ConfigValue def, const std::string& doc) {
  size_t want = def.index();
  if (!add_key(key, type, std::move(def), doc)) return std::nullopt;
  std::optional<GivenValue> g = given(schema_.fields().back());
  NK_CHECK(!g || g->value.index() == want, "config key '{}' given as another type", key);
  return g;
}

bool ConfigBinder::bind_int(const std::string& key, int64_t& field, const std::string& doc,
                            int64_t lo, int64_t hi) {
  std::optional<GivenValue> g = declare(key, ConfigType::Int, field, doc);
  if (!g) return false;
  int64_t x = std::get<int64_t>(g->value);
  if (x < lo || x > hi)
    fail("{}{} expects an int in {}..{}, got '{}'", g->where.empty() ? "" : g->where + ": ",
         name_of(key), lo, hi, x);
  field = x;
  return true;
}

bool ConfigBinder::bind(const std::string& key, double& field, const std::string& doc) {
  return bind_with<double>(key, field, doc, [&](double v) { field = v; });
}

bool ConfigBinder::bind(const std::string& key, bool& field, const std::string& doc) {
  return bind_with<bool>(key, field, doc, [&](bool v) { field = v; });
}

bool ConfigBinder::bind(const std::string& key, std::string& field, const std::string& doc) {
  return bind_with<std::string>(key, field, doc, [&](const std::string& v) { field = v; });
}

void ConfigBinder::select(const std::vector<Pick>& keys) {
  NK_CHECK(!selecting_, "bind_only inside bind_only");
  only_ = keys;
  selecting_ = true;
}

void ConfigBinder::end_select() {
  selecting_ = false;
  for (const Pick& p : only_) NK_CHECK(schema_.has(p.key), "bind_only: '{}' was not bound", p.key);
  only_.clear();
}

std::optional<GivenValue> ConfigReader::given(const ConfigSchema::Field& key) {
  switch (key.type) {
    case ConfigType::Int:
      return GivenValue{cfg_.get_int(key.key), ""};
    case ConfigType::Float:
      return GivenValue{cfg_.get_float(key.key), ""};
    case ConfigType::Bool:
      return GivenValue{cfg_.get_bool(key.key), ""};
    case ConfigType::String:
      return GivenValue{cfg_.get_string(key.key), ""};
  }
  return std::nullopt;
}

}  // namespace nk
