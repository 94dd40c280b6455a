// Typed configuration: a schema lists every key (type, default, one-line doc);
// a Config is the schema's defaults overlaid by a nested-YAML recipe and then by
// dotted command-line overrides ("train.lr=3e-4"). Anything a user types that
// does not fit the schema is an nk::Error naming the file and line or the
// override, and an unknown key names the nearest valid one. A YAML list given
// for a string key reads as its items joined by commas. Structs declare their
// keys and fill their fields with core/config_bind.h, one line per key.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace nk {

enum class ConfigType { Int, Float, Bool, String };
const char* config_type_name(ConfigType t);  // "int", "float", "bool", "string"

using ConfigValue = std::variant<int64_t, double, bool, std::string>;

class ConfigSchema {
 public:
  struct Field {
    std::string key;  // dotted: "model.n_layer"
    ConfigType type;
    ConfigValue def;
    std::string doc;
  };

  ConfigSchema& add_int(const std::string& key, int64_t def, const std::string& doc);
  ConfigSchema& add_float(const std::string& key, double def, const std::string& doc);
  ConfigSchema& add_bool(const std::string& key, bool def, const std::string& doc);
  ConfigSchema& add_string(const std::string& key, const std::string& def, const std::string& doc);
  ConfigSchema& add(const std::string& key, ConfigType type, ConfigValue def,
                    const std::string& doc);  // def holds `type`
  // An older name of `key` that sets it (a renamed key keeps working): listed
  // by help(), never written by Config::to_yaml().
  ConfigSchema& add_alias(const std::string& old_name, const std::string& key);

  bool has(const std::string& key) const;
  // The key `name` sets: itself, or the key it is an older name of; "" if neither.
  std::string resolve(const std::string& name) const;
  // True when `prefix` names a section, i.e. some key starts with "prefix.".
  bool is_section(const std::string& prefix) const;
  // The key with the smallest edit distance to `key` (over the whole dotted key,
  // or over the last component alone, whichever is smaller); "" if none is close.
  std::string nearest_key(const std::string& key) const;
  // Every key with type, default and doc in aligned columns, grouped by section.
  std::string help() const;

  const std::vector<Field>& fields() const { return fields_; }
  size_t index(const std::string& key) const;  // NK_CHECKs that the key exists

 private:
  void check_new_name(const std::string& key) const;
  std::vector<Field> fields_;  // in declaration order
  std::map<std::string, size_t> by_key_;
  std::map<std::string, std::string> aliases_;  // older name -> key
};

// The items of a comma-separated value ("a, b,c" -> {"a", "b", "c"}), each
// trimmed of spaces and tabs; empty items are dropped.
std::vector<std::string> split_commas(const std::string& s);

// Renders a value the way the YAML loader reads it back (floats keep a '.').
std::string config_value_str(const ConfigValue& v);

// For other readers of keys declared in a ConfigSchema (curate's YamlKeys),
// so that every key parses and fails alike. Parses `text` as `type`
// as Config::set does: nk::Error "<where>: key 'k' expects an int, got 'x'".
ConfigValue parse_config_value(ConfigType type, const std::string& key, const std::string& text,
                               const std::string& where);
// "<where>: unknown key 'k' (did you mean 'nearest'?)", as Config reports it.
std::string config_unknown_key_message(const ConfigSchema& schema, const std::string& key,
                                       const std::string& where);

class Config {
 public:
  // Defaults, then the YAML file (if path non-empty), then overrides "a.b=value" in order.
  static Config load(const ConfigSchema& schema, const std::string& yaml_path,
                     const std::vector<std::string>& overrides);
  static Config defaults(const ConfigSchema& schema);

  // Typed getters; asking for an undeclared key or the wrong type is a bug (NK_CHECK).
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  // Whether the YAML file or an override set `key` (or an older name of it),
  // whatever the value: a search leaves such keys as the user fixed them.
  bool given(const std::string& key) const;

  // Parses `value` as the key's schema type. `where` ("x.yaml:3", "override
  // 'a=b'") prefixes any error message.
  void set(const std::string& key, const std::string& value, const std::string& where);
  // Applies one "a.b=value" override.
  void apply_override(const std::string& override_text);
  // Applies a nested-YAML file; an empty file changes nothing.
  void merge_yaml_file(const std::string& path);

  // Nested YAML of the resolved values, in schema order; load() reads it back.
  std::string to_yaml() const;
  const ConfigSchema& schema() const { return schema_; }

 private:
  explicit Config(const ConfigSchema& schema);
  const ConfigValue& value(const std::string& key, ConfigType want) const;

  ConfigSchema schema_;
  std::vector<ConfigValue> values_;  // parallel to schema_.fields()
  std::vector<bool> given_;          // likewise: set by the file or an override
};

}  // namespace nk
