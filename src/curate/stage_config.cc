#include "curate/stage_config.h"

#include <fmt/format.h>

#include "core/error.h"

namespace nk::curate {

StageConfig::StageConfig(YAML::Node map, std::string file, int index)
    : YamlKeys(std::move(map), std::move(file)), index_(index) {
  std::string at = fmt::format("{}: stage {}", YamlKeys::where(root_), index);
  if (!root_.IsMap()) fail("{}: expected a map with a 'type' key", at);
  YAML::Node t = node("type");
  if (!t || !t.IsScalar() || t.Scalar().empty())
    fail("{}: missing 'type' (the kind of stage, e.g. type: word_count)", at);
  type_ = t.Scalar();
  YAML::Node n = node("name");
  name_ = n && n.IsScalar() ? n.Scalar() : type_;
  label_ = name_ == type_ ? type_ : fmt::format("{}: {}", name_, type_);
  where_ = fmt::format("{} ({})", at, label_);
  add_key("type", ConfigType::String, type_, "the kind of stage");
  add_key("name", ConfigType::String, type_,
          "the stage's name in the report and in removed records");
}

std::string StageConfig::where(const YAML::Node& n) const {
  if (!n || n.Mark().is_null()) return where_;
  return fmt::format("{}:{}: stage {} ({})", file_, n.Mark().line + 1, index_, label_);
}

std::string StageConfig::keys_hint() const {
  std::vector<std::string> takes;
  for (const ConfigSchema::Field& f : keys().fields())
    if (f.key != "type" && f.key != "name") takes.push_back(f.key);
  return takes.empty() ? " (this stage takes no keys)"
                       : fmt::format(" (this stage takes: {})", fmt::join(takes, ", "));
}

void StageConfig::bind_required(const std::string& key, std::string& field,
                                const std::string& doc) {
  if (!bind(key, field, doc)) throw Error(fmt::format("{}: missing key '{}'", where_, key));
  if (field.empty()) fail_key(key, "must not be empty");
}

}  // namespace nk::curate
