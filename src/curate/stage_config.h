// The settings of one pipeline stage: a YAML map such as
//   - type: word_count
//     min_words: 50
// A stage declares its keys the way the training config does, each bound to
// the field it fills in one line (core/config_bind.h, curate/yaml_keys.h):
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

#include <yaml-cpp/yaml.h>

#include "curate/yaml_keys.h"

namespace nk::curate {

class StageConfig : public YamlKeys {
 public:
  // `file`: the pipeline file (for messages); `index`: 1-based stage number.
  StageConfig(YAML::Node node, std::string file, int index);

  const std::string& type() const { return type_; }
  const std::string& name() const { return name_; }  // `name:` if given, else the type
  // "pipeline.yaml:12: stage 3 (word_count)", for messages.
  const std::string& where() const { return where_; }

  // As bind, for a key that must be given and not empty.
  void bind_required(const std::string& key, std::string& field, const std::string& doc);
  // The keys declared so far, in order, with types, defaults and docs.
  const ConfigSchema& keys() const { return schema(); }

 protected:
  // "<file>:<line>: stage N (label)", the stage's own line when `n` has none.
  std::string where(const YAML::Node& n) const override;
  std::string keys_hint() const override;  // " (this stage takes: ...)"

 private:
  std::string type_, name_, label_, where_;
  int index_ = 0;
};

}  // namespace nk::curate
