// The settings of one pipeline stage: a YAML map such as
//   - type: word_count
//     min_words: 50
// A stage declares its keys the way the training config does, each bound to
// the field it fills in one line (core/config_bind.h):
//   c.bind("min_words", min_words, "fewest words a kept document has");
// The field's type is the key's type and its current value the default.
// Scalars parse as the training config's do (bools also as yes/no, on/off,
// 1/0, as pipeline files always could), and every error names the
// pipeline file, the line and the stage ("pipeline.yaml:12: stage 3
// (word_count): key 'min_words' expects an int, got 'many'"); finish() rejects
// a key no stage declared, naming the nearest declared one, so a typo never
// passes silently.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "core/config_bind.h"

namespace nk::curate {

// Reads its keys from the stage's YAML map (ConfigBinder's bind for scalars).
class StageConfig : public ConfigBinder {
 public:
  // `file`: the pipeline file (for messages); `index`: 1-based stage number.
  StageConfig(YAML::Node node, std::string file, int index);

  const std::string& type() const { return type_; }
  const std::string& name() const { return name_; }  // `name:` if given, else the type
  // "pipeline.yaml:12: stage 3 (word_count)", for messages.
  const std::string& where() const { return where_; }

  // Each bind declares `key` with a one-line doc and binds it to `field`; when
  // the stage's map has the key, the field takes its value. Returns whether it
  // was given. Declaring a key twice is a bug (NK_CHECK).
  using ConfigBinder::bind;
  // A YAML list of scalars (a single scalar reads as a list of one).
  bool bind(const std::string& key, std::vector<std::string>& field, const std::string& doc);
  // A map of scalar keys to numbers, e.g. {2: 0.2, 3: 0.18}.
  bool bind(const std::string& key, std::vector<std::pair<std::string, double>>& field,
            const std::string& doc);
  // As bind, for a key that must be given and not empty.
  void bind_required(const std::string& key, std::string& field, const std::string& doc);

  bool has(const std::string& key) const;  // given in the stage's map
  // The keys declared so far, in order, with types, defaults and docs.
  const ConfigSchema& keys() const { return schema(); }
  bool reading() const override { return true; }

  // nk::Error "<where>: key 'k': <msg>" (with the key's own line when it has one).
  [[noreturn]] void fail_key(const std::string& key, const std::string& msg) const;
  // nk::Error for a key in the map that no bind declared: the nearest declared
  // key if one is close, else the list of them.
  void finish() const;

 protected:
  std::optional<GivenValue> given(const ConfigSchema::Field& key) override;

 private:
  // The scalar of a key's node: nk::Error naming the expected type otherwise.
  std::string scalar(const std::string& key, const YAML::Node& v, ConfigType type) const;
  // "<file>:<line>: stage N (label)" with the key's own line when it has one.
  std::string where_key(const std::string& key) const;

  YAML::Node node_;
  std::string file_, type_, name_, label_, where_;
  int index_ = 0;
};

}  // namespace nk::curate
