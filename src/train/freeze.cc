#include "train/freeze.h"

#include <fnmatch.h>

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace nk {

namespace {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// The parameter names with every layer's "h.L." shown once as "h.N.", for
// messages: what a pattern can match.
std::string name_summary(const ParamLayout& layout) {
  std::string out;
  int64_t layers = 0;
  for (const ParamInfo& p : layout.params()) {
    std::string name = p.name;
    size_t dot = name.find('.', 2);
    if (name.rfind("h.", 0) == 0 && dot != std::string::npos) {
      int64_t l = std::stoll(name.substr(2, dot - 2));
      layers = std::max(layers, l + 1);
      if (l != 0) continue;
      name = "h.N" + name.substr(dot);
    }
    out += (out.empty() ? "" : ", ") + name;
  }
  if (layers > 0) out += fmt::format(" (N = 0..{})", layers - 1);
  return out;
}

}  // namespace

std::vector<std::string> match_frozen(const ParamLayout& layout, const std::string& patterns,
                                      const std::string& key) {
  std::vector<bool> frozen(layout.params().size(), false);
  if (trim(patterns).empty()) return {};
  size_t start = 0;
  while (start <= patterns.size()) {
    size_t comma = std::min(patterns.find(',', start), patterns.size());
    const std::string pattern = trim(patterns.substr(start, comma - start));
    start = comma + 1;
    if (pattern.empty()) fail("{}: empty pattern in '{}'", key, patterns);
    bool any = false;
    for (size_t i = 0; i < frozen.size(); ++i) {
      if (fnmatch(pattern.c_str(), layout.params()[i].name.c_str(), 0) != 0) continue;
      frozen[i] = true;
      any = true;
    }
    if (!any)
      fail("{}: pattern '{}' matches no parameter; the parameters are {}", key, pattern,
           name_summary(layout));
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < frozen.size(); ++i)
    if (frozen[i]) names.push_back(layout.params()[i].name);
  if (names.size() == frozen.size())
    fail("{}: '{}' freezes every parameter, leaving nothing to train", key, patterns);
  return names;
}

std::string frozen_list(const ParamLayout& layout) {
  std::string out;
  for (const ParamInfo& p : layout.params())
    if (!p.trainable) out += (out.empty() ? "" : ",") + p.name;
  return out;
}

}  // namespace nk
