// Keys read from a YAML map (a curate pipeline file, one stage of it), each
// bound to its field in one line as every config key is (core/config_bind.h):
//   k.bind("workers", workers, "threads (0 = all cores)");
// Dotted keys name nested maps ("input.format" is `input: {format: ...}`).
// Scalars parse as Config's do, bools also as YAML 1.1's yes/no, on/off,
// 1/0 (as pipeline files always could); every error names the file and line.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "core/config_bind.h"

namespace nk::curate {

class YamlKeys : public ConfigBinder {
 public:
  // `file` names the YAML in messages.
  YamlKeys(YAML::Node root, std::string file);

  using ConfigBinder::bind;
  // A YAML list of scalars (a single scalar reads as a list of one).
  bool bind(const std::string& key, std::vector<std::string>& field, const std::string& doc);
  // A map of scalar keys to numbers, e.g. {2: 0.2, 3: 0.18}.
  bool bind(const std::string& key, std::vector<std::pair<std::string, double>>& field,
            const std::string& doc);

  bool has(const std::string& key) const;  // given in the map
  bool reading() const override { return true; }
  // nk::Error "<where>: key 'k': <msg>" (with the key's own line when it has one).
  [[noreturn]] void fail_key(const std::string& key, const std::string& msg) const;
  // nk::Error for a key in the map that no bind declared, naming the nearest
  // declared one if one is close; keys in `handled` are read elsewhere.
  void finish(const std::vector<std::string>& handled = {}) const;

 protected:
  std::optional<GivenValue> given(const ConfigSchema::Field& key) override;
  // "<file>:<line>" of `n` ("<file>" when it has no position).
  virtual std::string where(const YAML::Node& n) const;
  // Added to an unknown key's message when no declared key is close.
  virtual std::string keys_hint() const;
  std::string where_key(const std::string& key) const { return where(node(key)); }
  YAML::Node node(const std::string& key) const;  // an undefined node when absent

  YAML::Node root_;
  std::string file_;

 private:
  // The scalar of a key's node: nk::Error naming the expected type otherwise.
  std::string scalar(const std::string& key, const YAML::Node& v, ConfigType type) const;
  void check_map(const YAML::Node& map, const std::string& section,
                 const std::vector<std::string>& handled) const;
};

}  // namespace nk::curate
