#include "apps/arg_parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "core/error.h"

namespace nk {

namespace {

bool looks_like_option(const std::string& s) {
  // "-5" is a (bad) token id, not an option; "-" alone means stdin.
  return s.size() > 1 && s[0] == '-' && !(s[1] >= '0' && s[1] <= '9');
}

bool is_help(const std::string& s) {
  return s == "--help" || s == "-h";
}

}  // namespace

CommandLine::CommandLine(std::string command, std::vector<std::string> args, size_t from)
    : command_(std::move(command)), args_(std::move(args)), used_(args_.size()), from_(from) {
  for (size_t i = from_; i < args_.size(); ++i) help_ |= is_help(args_[i]);
}

bool CommandLine::take(const std::string& option, int values, std::vector<std::string>& out) {
  bool found = false;
  for (size_t i = from_; i < args_.size(); ++i) {
    const std::string& a = args_[i];
    size_t eq = a.find('=');
    if (!looks_like_option(a) || a.substr(0, eq) != option) continue;
    found = used_[i] = true;
    if (values == 0) {
      if (eq != a.npos) fail("{}: option {} takes no value", command_, option);
      continue;
    }
    if (eq != a.npos) {
      out.push_back(a.substr(eq + 1));
      continue;
    }
    if (i + 1 >= args_.size() || looks_like_option(args_[i + 1]))
      fail("{}: option {} needs a value", command_, option);
    do {
      used_[++i] = true;
      out.push_back(args_[i]);
    } while (values < 0 && i + 1 < args_.size() && !looks_like_option(args_[i + 1]));
  }
  return found;
}

std::optional<GivenValue> CommandLine::given(const ConfigSchema::Field& key) {
  std::vector<std::string> v;
  if (help_ || !take(key.key, key.type == ConfigType::Bool ? 0 : 1, v)) return std::nullopt;
  switch (key.type) {
    case ConfigType::Bool:
      return GivenValue{true, command_};
    case ConfigType::Int:
      return GivenValue{parse_int(v.back(), key.key), command_};
    case ConfigType::Float:
      return GivenValue{parse_double(v.back(), key.key), command_};
    case ConfigType::String:
      break;
  }
  return GivenValue{v.back(), command_};
}

bool CommandLine::bind(const std::string& option, std::vector<std::string>& field,
                       const std::string& doc) {
  if (!add_key(option, ConfigType::String, fmt::format("{}", fmt::join(field, " ")),
               doc + " (one or more)"))
    return false;
  std::vector<std::string> v;
  if (help_ || !take(option, -1, v)) return false;
  field = std::move(v);
  return true;
}

bool CommandLine::has(const std::string& option) const {
  for (size_t i = from_; i < args_.size(); ++i)
    if (looks_like_option(args_[i]) && args_[i].substr(0, args_[i].find('=')) == option)
      return true;
  return false;
}

std::vector<std::string> CommandLine::finish() const {
  std::vector<std::string> positional;
  for (size_t i = from_; i < args_.size(); ++i) {
    if (used_[i] || is_help(args_[i])) continue;
    const std::string& a = args_[i];
    if (!looks_like_option(a)) {
      positional.push_back(a);
      continue;
    }
    std::string name = a.substr(0, a.find('='));
    std::string near = schema().nearest_key(name);
    if (!near.empty()) fail("{}: unknown option '{}' (did you mean '{}'?)", command_, name, near);
    std::vector<std::string> known;
    for (const ConfigSchema::Field& f : schema().fields()) known.push_back(f.key);
    fail("{}: unknown option '{}' (options: {})", command_, name, fmt::join(known, " "));
  }
  return positional;
}

std::string CommandLine::help_text(const std::string& usage) const {
  std::vector<std::pair<std::string, std::string>> rows;
  size_t width = 0;
  for (const ConfigSchema::Field& f : schema().fields()) {
    std::string left = f.key, def = config_value_str(f.def), type = config_type_name(f.type);
    for (char& c : type) c = char(std::toupper(static_cast<unsigned char>(c)));
    if (f.type != ConfigType::Bool) left += " " + type;
    // A required option's default is only a placeholder.
    bool shown = f.type != ConfigType::Bool && !def.empty() && !f.doc.ends_with("(required)");
    rows.emplace_back(left, shown ? fmt::format("{} (default {})", f.doc, def) : f.doc);
    width = std::max(width, left.size());
  }
  std::string out = fmt::format("{}\n{} options:\n", usage, command_);
  // Docs wrapped at 80 columns, continuation lines under the doc's first.
  const size_t room = std::max<size_t>(30, 80 - (width + 4));
  for (const auto& [left, doc] : rows) {
    std::string line = fmt::format("  {:<{}}  ", left, width);
    size_t col = 0;
    for (size_t at = 0; at < doc.size();) {
      size_t end = std::min(doc.find(' ', at), doc.size());
      if (col > 0 && col + 1 + (end - at) > room) {
        out += line + "\n";
        line = std::string(width + 4, ' ');
        col = 0;
      }
      if (col > 0) line += ' ', ++col;
      line.append(doc, at, end - at);
      col += end - at;
      at = end + 1;
    }
    out += line + "\n";
  }
  return out;
}

int64_t parse_int(const std::string& s, const std::string& what) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty())
    fail("{}: '{}' is not an integer", what, s);
  return v;
}

double parse_double(const std::string& s, const std::string& what) {
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty())
    fail("{}: '{}' is not a number", what, s);
  return v;
}

}  // namespace nk
