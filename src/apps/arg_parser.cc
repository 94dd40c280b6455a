#include "apps/arg_parser.h"

#include <charconv>

#include "core/error.h"

namespace nk {

namespace {

bool looks_like_option(const std::string& s) {
  // "-5" is a (bad) token id, not an option; "-" alone means stdin.
  return s.size() > 1 && s[0] == '-' && !(s[1] >= '0' && s[1] <= '9');
}

}  // namespace

Parsed parse_options(const std::string& command, const std::vector<std::string>& args, size_t from,
                     const std::map<std::string, Arity>& options) {
  Parsed p;
  for (size_t i = from; i < args.size(); ++i) {
    std::string a = args[i];
    if (!looks_like_option(a)) {
      p.positional.push_back(a);
      continue;
    }
    std::string value;
    bool inline_value = false;
    if (size_t eq = a.find('='); eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      inline_value = true;
    }
    auto it = options.find(a);
    if (it == options.end()) {
      std::string known;
      for (auto& [k, ar] : options) known += " " + k;
      fail("{}: unknown option '{}' (options:{})", command, a, known);
    }
    auto& vals = p.values[a];
    if (it->second == Arity::kFlag) {
      if (inline_value) fail("{}: option {} takes no value", command, a);
      continue;
    }
    if (inline_value) {
      vals.push_back(value);
      continue;
    }
    if (i + 1 >= args.size() || looks_like_option(args[i + 1]))
      fail("{}: option {} needs a value", command, a);
    vals.push_back(args[++i]);
    if (it->second == Arity::kMany)
      while (i + 1 < args.size() && !looks_like_option(args[i + 1])) vals.push_back(args[++i]);
  }
  return p;
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
