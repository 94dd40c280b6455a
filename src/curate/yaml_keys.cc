#include "curate/yaml_keys.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/yaml_node.h"

namespace nk::curate {

YamlKeys::YamlKeys(YAML::Node root, std::string file)
    : root_(std::move(root)), file_(std::move(file)) {}

YAML::Node YamlKeys::node(const std::string& key) const {
  // Lookups through const handles: a missing key gives an invalid node and
  // inserts nothing. reset() rebinds a handle; `=` would overwrite its node.
  const YAML::Node none_map(YAML::NodeType::Map);
  YAML::Node n = root_;
  for (size_t start = 0;;) {
    size_t dot = key.find('.', start);
    const YAML::Node map = n.IsMap() ? n : none_map;
    const YAML::Node next = map[key.substr(start, dot - start)];
    if (!next || dot == std::string::npos) return next;
    n.reset(next);
    start = dot + 1;
  }
}

bool YamlKeys::has(const std::string& key) const {
  return bool(node(key));
}

std::string YamlKeys::where(const YAML::Node& n) const {
  if (!n || n.Mark().is_null()) return file_;
  return fmt::format("{}:{}", file_, n.Mark().line + 1);
}

std::string YamlKeys::keys_hint() const {
  std::vector<std::string> keys;
  for (const ConfigSchema::Field& f : schema().fields()) keys.push_back(f.key);
  return fmt::format(" (keys: {})", fmt::join(keys, ", "));
}

void YamlKeys::fail_key(const std::string& key, const std::string& msg) const {
  throw Error(fmt::format("{}: key '{}': {}", where_key(key), key, msg));
}

std::string YamlKeys::scalar(const std::string& key, const YAML::Node& v, ConfigType type) const {
  if (!v.IsScalar())
    fail("{}: key '{}' expects {} value, got {}", where(v), key, config_type_name(type),
         yaml_node_kind(v));
  return v.Scalar();
}

std::optional<GivenValue> YamlKeys::given(const ConfigSchema::Field& key) {
  YAML::Node v = node(key.key);
  if (!v) return std::nullopt;
  std::string at = where(v);
  const std::string s = scalar(key.key, v, key.type);
  if (key.type == ConfigType::Bool) {
    if (s == "yes" || s == "on" || s == "1") return GivenValue{true, at};
    if (s == "no" || s == "off" || s == "0") return GivenValue{false, at};
  }
  return GivenValue{parse_config_value(key.type, key.key, s, at), at};
}

bool YamlKeys::bind(const std::string& key, std::vector<std::string>& field,
                    const std::string& doc) {
  YAML::Node v = node(key);
  if (!add_key(key, ConfigType::String, fmt::format("[{}]", fmt::join(field, ", ")),
               doc + " (a list)") ||
      !v)
    return false;
  if (v.IsScalar()) {
    field = {v.Scalar()};
    return true;
  }
  if (!v.IsSequence()) fail_key(key, "expected a list of strings");
  field.clear();
  for (const YAML::Node& item : v) {
    if (!item.IsScalar()) fail_key(key, "expected a list of strings");
    field.push_back(item.Scalar());
  }
  return true;
}

bool YamlKeys::bind(const std::string& key, std::vector<std::pair<std::string, double>>& field,
                    const std::string& doc) {
  std::vector<std::string> items;
  for (const auto& [k, x] : field) items.push_back(fmt::format("{}: {}", k, x));
  YAML::Node v = node(key);
  if (!add_key(key, ConfigType::String, fmt::format("{{{}}}", fmt::join(items, ", ")),
               doc + " (a map)") ||
      !v)
    return false;
  if (!v.IsMap()) fail_key(key, "expected a map such as {2: 0.2, 3: 0.18}");
  field.clear();
  for (const auto& kv : v) {
    if (!kv.first.IsScalar() || !kv.second.IsScalar())
      fail_key(key, "expected a map of scalars to numbers");
    double x = std::get<double>(parse_config_value(ConfigType::Float, key + "." + kv.first.Scalar(),
                                                   kv.second.Scalar(), where_key(key)));
    field.emplace_back(kv.first.Scalar(), x);
  }
  return true;
}

void YamlKeys::finish(const std::vector<std::string>& handled) const {
  check_map(root_, "", handled);
}

void YamlKeys::check_map(const YAML::Node& map, const std::string& section,
                         const std::vector<std::string>& handled) const {
  for (const auto& kv : map) {
    std::string k = (section.empty() ? "" : section + ".") +
                    (kv.first.IsScalar() ? kv.first.Scalar() : std::string("?"));
    if (schema().has(k) || std::find(handled.begin(), handled.end(), k) != handled.end()) continue;
    if (schema().is_section(k)) {
      if (!kv.second.IsMap()) fail("{}: '{}' must be a map", where(kv.second), k);
      check_map(kv.second, k, handled);
      continue;
    }
    std::string msg = config_unknown_key_message(schema(), k, where(kv.first));
    if (schema().nearest_key(k).empty()) msg += keys_hint();
    throw Error(msg);
  }
}

}  // namespace nk::curate
