#include "curate/stage_config.h"

#include <fmt/format.h>

#include "core/error.h"

namespace nk::curate {

namespace {

std::string line_of(const std::string& file, const YAML::Node& n) {
  if (n.Mark().is_null()) return file;
  return fmt::format("{}:{}", file, n.Mark().line + 1);
}

// As the training config names a value of the wrong shape.
const char* node_kind(const YAML::Node& n) {
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

// A list's or map's default, as YAML's flow style writes it (for keys()).
std::string flow(const std::vector<std::string>& items) {
  return fmt::format("[{}]", fmt::join(items, ", "));
}

}  // namespace

StageConfig::StageConfig(YAML::Node node, std::string file, int index)
    : node_(std::move(node)), file_(std::move(file)) {
  std::string at = fmt::format("{}: stage {}", line_of(file_, node_), index);
  if (!node_.IsMap()) fail("{}: expected a map with a 'type' key", at);
  YAML::Node t = node_["type"];
  if (!t || !t.IsScalar() || t.Scalar().empty())
    fail("{}: missing 'type' (the kind of stage, e.g. type: word_count)", at);
  type_ = t.Scalar();
  YAML::Node n = node_["name"];
  name_ = n && n.IsScalar() ? n.Scalar() : type_;
  index_ = index;
  label_ = name_ == type_ ? type_ : fmt::format("{}: {}", name_, type_);
  where_ = fmt::format("{} ({})", at, label_);
  add_key("type", ConfigType::String, type_, "the kind of stage");
  add_key("name", ConfigType::String, type_,
          "the stage's name in the report and in removed records");
}

bool StageConfig::has(const std::string& key) const {
  return bool(node_[key]);
}

std::string StageConfig::where_key(const std::string& key) const {
  YAML::Node v = node_[key];
  if (v && !v.Mark().is_null())
    return fmt::format("{}:{}: stage {} ({})", file_, v.Mark().line + 1, index_, label_);
  return where_;
}

void StageConfig::fail_key(const std::string& key, const std::string& msg) const {
  throw Error(fmt::format("{}: key '{}': {}", where_key(key), key, msg));
}

std::string StageConfig::scalar(const std::string& key, const YAML::Node& v,
                                ConfigType type) const {
  if (!v.IsScalar())
    fail("{}: key '{}' expects {} value, got {}", where_key(key), key, config_type_name(type),
         node_kind(v));
  return v.Scalar();
}

std::optional<GivenValue> StageConfig::given(const ConfigSchema::Field& key) {
  YAML::Node v = node_[key.key];
  if (!v) return std::nullopt;
  std::string where = where_key(key.key);
  const std::string s = scalar(key.key, v, key.type);
  // Pipeline files have always taken YAML 1.1's spellings too (nfc: no).
  if (key.type == ConfigType::Bool) {
    if (s == "yes" || s == "on" || s == "1") return GivenValue{true, where};
    if (s == "no" || s == "off" || s == "0") return GivenValue{false, where};
  }
  return GivenValue{parse_config_value(key.type, key.key, s, where), where};
}

void StageConfig::bind_required(const std::string& key, std::string& field,
                                const std::string& doc) {
  if (!bind(key, field, doc)) throw Error(fmt::format("{}: missing key '{}'", where_, key));
  if (field.empty()) fail_key(key, "must not be empty");
}

bool StageConfig::bind(const std::string& key, std::vector<std::string>& field,
                       const std::string& doc) {
  YAML::Node v = node_[key];
  if (!add_key(key, ConfigType::String, flow(field), doc + " (a list)") || !v) return false;
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

bool StageConfig::bind(const std::string& key, std::vector<std::pair<std::string, double>>& field,
                       const std::string& doc) {
  std::vector<std::string> items;
  for (const auto& [k, x] : field) items.push_back(fmt::format("{}: {}", k, x));
  YAML::Node v = node_[key];
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

void StageConfig::finish() const {
  for (const auto& kv : node_) {
    std::string k = kv.first.IsScalar() ? kv.first.Scalar() : "?";
    if (keys().has(k)) continue;
    std::string at =
        kv.first.Mark().is_null()
            ? where_
            : fmt::format("{}:{}: stage {} ({})", file_, kv.first.Mark().line + 1, index_, label_);
    std::string msg = config_unknown_key_message(keys(), k, at);
    if (keys().nearest_key(k).empty()) {
      // Nothing close: name what the stage takes instead.
      std::vector<std::string> takes;
      for (const ConfigSchema::Field& f : keys().fields())
        if (f.key != "type" && f.key != "name") takes.push_back(f.key);
      msg += takes.empty() ? " (this stage takes no keys)"
                           : fmt::format(" (this stage takes: {})", fmt::join(takes, ", "));
    }
    throw Error(msg);
  }
}

}  // namespace nk::curate
