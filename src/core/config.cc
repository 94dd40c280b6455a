// Config: resolving defaults < YAML file < overrides, with user-facing errors.
#include "core/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/yaml_node.h"

namespace nk {

namespace {

// "where: " or "" so messages read the same with or without a location.
std::string prefix(const std::string& where) {
  return where.empty() ? "" : where + ": ";
}

std::string unknown_key_message(const ConfigSchema& schema, const std::string& key,
                                const std::string& where) {
  std::string msg = fmt::format("{}unknown key '{}'", prefix(where), key);
  std::string near = schema.nearest_key(key);
  if (!near.empty()) msg += fmt::format(" (did you mean '{}'?)", near);
  return msg;
}

std::string trim(std::string s) {
  const char* ws = " \t\r\n";
  s.erase(0, s.find_first_not_of(ws));
  s.erase(s.find_last_not_of(ws) + 1);
  return s;
}

// Parses `text` as `type`; throws nk::Error mentioning `where` and `key`.
ConfigValue parse_value(ConfigType type, const std::string& key, const std::string& text,
                        const std::string& where) {
  auto bad = [&](const char* article) {
    return Error(fmt::format("{}key '{}' expects {} {}, got '{}'", prefix(where), key, article,
                             config_type_name(type), text));
  };
  const char* b = text.data();
  const char* e = b + text.size();
  switch (type) {
    case ConfigType::Int: {
      // Plain decimal integers only: "1.5", "1e3" and "0x10" are rejected.
      const char* p = b + (b != e && *b == '+');
      if (p != b && p != e && *p == '-') throw bad("an");
      int64_t v = 0;
      auto [end, ec] = std::from_chars(p, e, v);
      if (ec == std::errc::result_out_of_range)
        fail("{}key '{}' value '{}' is out of int64 range", prefix(where), key, text);
      if (ec != std::errc() || end != e || p == e) throw bad("an");
      return v;
    }
    case ConfigType::Float: {
      const char* p = b + (b != e && *b == '+');
      if (p != b && p != e && *p == '-') throw bad("a");
      double v = 0;
      auto [end, ec] = std::from_chars(p, e, v);
      if (ec == std::errc::result_out_of_range)
        fail("{}key '{}' value '{}' is out of float range", prefix(where), key, text);
      if (ec != std::errc() || end != e || p == e || !std::isfinite(v)) throw bad("a");
      return v;
    }
    case ConfigType::Bool:
      if (text == "true") return true;
      if (text == "false") return false;
      throw bad("a");
    case ConfigType::String:
      return text;
  }
  NK_CHECK(false, "bad config type");
}

std::string where_in(const std::string& path, const YAML::Mark& m) {
  return fmt::format("{}:{}", path, m.line + 1);
}

// Walks a YAML map whose keys are relative to `section` ("" at the top).
void merge_map(Config& cfg, const YAML::Node& map, const std::string& section,
               const std::string& path) {
  const ConfigSchema& schema = cfg.schema();
  for (const auto& kv : map) {
    // Copies: Node is a cheap handle, and the iterator's pair is a temporary.
    const YAML::Node k = kv.first;
    const YAML::Node v = kv.second;
    if (!k.IsScalar())
      fail("{}: keys must be plain names, got {}", where_in(path, k.Mark()), yaml_node_kind(k));
    std::string key = section.empty() ? k.Scalar() : section + "." + k.Scalar();
    if (std::string real = schema.resolve(key); !real.empty()) {
      ConfigType type = schema.fields()[schema.index(real)].type;
      bool is_string = type == ConfigType::String;
      if (is_string && v.IsSequence()) {
        // A list for a string key ("blend: [0.3, a, 0.7, b]") is its items
        // joined with commas, the key's command-line form.
        std::string joined;
        bool first = true;
        for (const auto& item : v) {
          if (!item.IsScalar())
            fail("{}: key '{}' expects a list of plain values, got {} in it",
                 where_in(path, item.Mark()), key, yaml_node_kind(item));
          joined += (first ? "" : ",") + item.Scalar();
          first = false;
        }
        cfg.set(key, joined, where_in(path, v.Mark()));
        continue;
      }
      if (!v.IsScalar())
        fail("{}: key '{}' expects {} value, got {}", where_in(path, v.Mark()), key,
             config_type_name(type), yaml_node_kind(v));
      cfg.set(key, v.Scalar(), where_in(path, v.Mark()));
    } else if (schema.is_section(key)) {
      if (v.IsNull()) continue;  // "model:" with nothing under it
      if (!v.IsMap())
        fail("{}: '{}' is a section and expects a map of keys, got {}", where_in(path, v.Mark()),
             key, v.IsScalar() ? "'" + v.Scalar() + "'" : std::string(yaml_node_kind(v)));
      merge_map(cfg, v, key, path);
    } else if (v.IsMap() && v.size() > 0) {
      // A misspelt section: report its first leaf, whose full key finds the
      // nearest match ("modle.n_layer" -> "model.n_layer").
      merge_map(cfg, v, key, path);
    } else {
      throw Error(unknown_key_message(schema, key, where_in(path, k.Mark())));
    }
  }
}

// An ordered tree of key components, so to_yaml nests sections in schema order.
struct KeyTree {
  std::vector<std::pair<std::string, std::unique_ptr<KeyTree>>> children;
  int field = -1;  // leaf: index into the schema
  KeyTree& child(const std::string& name) {
    for (auto& [n, c] : children)
      if (n == name) return *c;
    children.emplace_back(name, std::make_unique<KeyTree>());
    return *children.back().second;
  }
};

void emit_tree(YAML::Emitter& out, const KeyTree& tree, const ConfigSchema& schema,
               const std::vector<ConfigValue>& values) {
  out << YAML::BeginMap;
  for (const auto& [name, node] : tree.children) {
    out << YAML::Key << name << YAML::Value;
    if (node->field < 0) {
      emit_tree(out, *node, schema, values);
      continue;
    }
    const ConfigValue& v = values[node->field];
    // Strings are always quoted so that "true" or "12" stay strings to other readers.
    if (std::holds_alternative<std::string>(v)) out << YAML::DoubleQuoted;
    out << config_value_str(v);
  }
  out << YAML::EndMap;
}

}  // namespace

const char* yaml_node_kind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "no value";
    default:
      return "a scalar";
  }
}

Config::Config(const ConfigSchema& schema) : schema_(schema) {
  for (const auto& f : schema_.fields()) values_.push_back(f.def);
  given_.assign(values_.size(), false);
}

Config Config::defaults(const ConfigSchema& schema) {
  return Config(schema);
}

Config Config::load(const ConfigSchema& schema, const std::string& yaml_path,
                    const std::vector<std::string>& overrides) {
  Config cfg(schema);
  if (!yaml_path.empty()) cfg.merge_yaml_file(yaml_path);
  for (const auto& o : overrides) cfg.apply_override(o);
  return cfg;
}

void Config::merge_yaml_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("config file '{}' not found", path);
  if (std::filesystem::is_directory(path, ec)) fail("config file '{}' is a directory", path);
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) fail("config file '{}' could not be read", path);
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::Exception& e) {
    fail("{}:{}: invalid YAML: {}", path, e.mark.line + 1, e.msg);
  }
  if (root.IsNull()) return;  // empty file: all defaults
  if (!root.IsMap())
    fail("{}: the top level must be a map of keys, got {}", where_in(path, root.Mark()),
         yaml_node_kind(root));
  merge_map(*this, root, "", path);
}

void Config::apply_override(const std::string& text) {
  std::string where = fmt::format("override '{}'", text);
  size_t eq = text.find('=');
  if (eq == std::string::npos) fail("{}: expected key=value", where);
  std::string key = trim(text.substr(0, eq));
  if (key.empty()) fail("{}: missing key before '='", where);
  set(key, trim(text.substr(eq + 1)), where);
}

void Config::set(const std::string& key, const std::string& value, const std::string& where) {
  std::string real = schema_.resolve(key);
  if (real.empty()) {
    if (schema_.is_section(key))
      fail("{}'{}' is a section, not a key; set one of its keys like '{}.<name>'", prefix(where),
           key, key);
    throw Error(unknown_key_message(schema_, key, where));
  }
  size_t i = schema_.index(real);
  values_[i] = parse_value(schema_.fields()[i].type, key, value, where);
  given_[i] = true;
}

const ConfigValue& Config::value(const std::string& key, ConfigType want) const {
  size_t i = schema_.index(key);
  NK_CHECK(schema_.fields()[i].type == want, "config key '{}' is {}, read as {}", key,
           config_type_name(schema_.fields()[i].type), config_type_name(want));
  return values_[i];
}

int64_t Config::get_int(const std::string& key) const {
  return std::get<int64_t>(value(key, ConfigType::Int));
}
double Config::get_float(const std::string& key) const {
  return std::get<double>(value(key, ConfigType::Float));
}
bool Config::get_bool(const std::string& key) const {
  return std::get<bool>(value(key, ConfigType::Bool));
}
std::string Config::get_string(const std::string& key) const {
  return std::get<std::string>(value(key, ConfigType::String));
}

bool Config::given(const std::string& key) const {
  const std::string real = schema_.resolve(key);
  NK_CHECK(!real.empty(), "config key '{}' is not declared", key);
  return given_[schema_.index(real)];
}

ConfigValue parse_config_value(ConfigType type, const std::string& key, const std::string& text,
                               const std::string& where) {
  return parse_value(type, key, text, where);
}

std::string config_unknown_key_message(const ConfigSchema& schema, const std::string& key,
                                       const std::string& where) {
  return unknown_key_message(schema, key, where);
}

std::string Config::to_yaml() const {
  KeyTree root;
  const auto& fields = schema_.fields();
  for (size_t i = 0; i < fields.size(); ++i) {
    KeyTree* node = &root;
    const std::string& key = fields[i].key;
    for (size_t start = 0;;) {
      size_t dot = key.find('.', start);
      node = &node->child(key.substr(start, dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    node->field = int(i);
  }
  if (root.children.empty()) return "{}\n";
  YAML::Emitter out;
  emit_tree(out, root, schema_, values_);
  return std::string(out.c_str()) + "\n";
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = std::min(s.find(',', start), s.size());
    const size_t b = s.find_first_not_of(" \t", start);
    if (b < comma) out.push_back(s.substr(b, s.find_last_not_of(" \t", comma - 1) + 1 - b));
    start = comma + 1;
  }
  return out;
}

}  // namespace nk
