#include "curate/stage_config.h"

#include <fmt/format.h>

#include "core/error.h"

namespace nk::curate {

namespace {

std::string line_of(const std::string& file, const YAML::Node& n) {
  if (n.Mark().is_null()) return file;
  return fmt::format("{}:{}", file, n.Mark().line + 1);
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
  used_.insert("type");
  YAML::Node n = node_["name"];
  name_ = n && n.IsScalar() ? n.Scalar() : type_;
  used_.insert("name");
  index_ = index;
  label_ = name_ == type_ ? type_ : fmt::format("{}: {}", name_, type_);
  where_ = fmt::format("{} ({})", at, label_);
}

bool StageConfig::has(const std::string& key) const {
  return bool(node_[key]);
}

YAML::Node StageConfig::value(const std::string& key) {
  used_.insert(key);
  return node_[key];
}

std::string StageConfig::where_key(const std::string& key) const {
  YAML::Node v = node_[key];
  if (v && !v.Mark().is_null())
    return fmt::format("{}:{}: stage {} ({}): key '{}'", file_, v.Mark().line + 1, index_, label_,
                       key);
  return fmt::format("{}: key '{}'", where_, key);
}

void StageConfig::fail_key(const std::string& key, const std::string& msg) const {
  throw Error(fmt::format("{}: {}", where_key(key), msg));
}

int64_t StageConfig::get_int(const std::string& key, int64_t def) {
  YAML::Node v = value(key);
  if (!v) return def;
  if (!v.IsScalar()) fail_key(key, "expected an integer");
  try {
    size_t pos = 0;
    long long x = std::stoll(v.Scalar(), &pos);
    if (pos == v.Scalar().size()) return x;
  } catch (const std::exception&) {
  }
  fail_key(key, fmt::format("expected an integer, got '{}'", v.Scalar()));
}

double StageConfig::get_double(const std::string& key, double def) {
  YAML::Node v = value(key);
  if (!v) return def;
  if (!v.IsScalar()) fail_key(key, "expected a number");
  try {
    size_t pos = 0;
    double x = std::stod(v.Scalar(), &pos);
    if (pos == v.Scalar().size()) return x;
  } catch (const std::exception&) {
  }
  fail_key(key, fmt::format("expected a number, got '{}'", v.Scalar()));
}

bool StageConfig::get_bool(const std::string& key, bool def) {
  YAML::Node v = value(key);
  if (!v) return def;
  if (v.IsScalar()) {
    const std::string& s = v.Scalar();
    if (s == "true" || s == "yes" || s == "on" || s == "1") return true;
    if (s == "false" || s == "no" || s == "off" || s == "0") return false;
    fail_key(key, fmt::format("expected true or false, got '{}'", s));
  }
  fail_key(key, "expected true or false");
}

std::string StageConfig::get_string(const std::string& key, const std::string& def) {
  YAML::Node v = value(key);
  if (!v) return def;
  if (!v.IsScalar()) fail_key(key, "expected a string");
  return v.Scalar();
}

std::string StageConfig::require_string(const std::string& key) {
  if (!has(key)) throw Error(fmt::format("{}: missing key '{}'", where_, key));
  std::string s = get_string(key, "");
  if (s.empty()) fail_key(key, "must not be empty");
  return s;
}

std::vector<std::string> StageConfig::get_strings(const std::string& key,
                                                  const std::vector<std::string>& def) {
  YAML::Node v = value(key);
  if (!v) return def;
  if (v.IsScalar()) return {v.Scalar()};
  if (!v.IsSequence()) fail_key(key, "expected a list of strings");
  std::vector<std::string> out;
  for (const YAML::Node& item : v) {
    if (!item.IsScalar()) fail_key(key, "expected a list of strings");
    out.push_back(item.Scalar());
  }
  return out;
}

std::vector<double> StageConfig::get_doubles(const std::string& key,
                                             const std::vector<double>& def) {
  std::vector<std::string> s = get_strings(key, {});
  if (!has(key)) return def;
  std::vector<double> out;
  for (const std::string& x : s) {
    try {
      size_t pos = 0;
      double d = std::stod(x, &pos);
      if (pos == x.size()) {
        out.push_back(d);
        continue;
      }
    } catch (const std::exception&) {
    }
    fail_key(key, fmt::format("expected numbers, got '{}'", x));
  }
  return out;
}

std::vector<std::pair<std::string, double>> StageConfig::get_number_map(
    const std::string& key, const std::vector<std::pair<std::string, double>>& def) {
  YAML::Node v = value(key);
  if (!v) return def;
  if (!v.IsMap()) fail_key(key, "expected a map such as {2: 0.2, 3: 0.18}");
  std::vector<std::pair<std::string, double>> out;
  for (const auto& kv : v) {
    if (!kv.first.IsScalar() || !kv.second.IsScalar())
      fail_key(key, "expected a map of scalars to numbers");
    try {
      size_t pos = 0;
      double d = std::stod(kv.second.Scalar(), &pos);
      if (pos == kv.second.Scalar().size()) {
        out.emplace_back(kv.first.Scalar(), d);
        continue;
      }
    } catch (const std::exception&) {
    }
    fail_key(key, fmt::format("entry '{}': expected a number, got '{}'", kv.first.Scalar(),
                              kv.second.Scalar()));
  }
  return out;
}

void StageConfig::finish() const {
  std::vector<std::string> unknown;
  for (const auto& kv : node_) {
    std::string k = kv.first.IsScalar() ? kv.first.Scalar() : "?";
    if (!used_.count(k)) unknown.push_back(k);
  }
  if (unknown.empty()) return;
  std::string known;
  for (const std::string& k : used_)
    if (k != "type" && k != "name") known += (known.empty() ? "" : ", ") + k;
  const YAML::Node v = node_[unknown[0]];
  std::string at = v && !v.Mark().is_null() ? fmt::format("{}:{}: stage {} ({})", file_,
                                                          v.Mark().line + 1, index_, label_)
                                            : where_;
  throw Error(fmt::format("{}: unknown key '{}' (this stage takes: {})", at, unknown[0],
                          known.empty() ? "no keys" : known));
}

}  // namespace nk::curate
