// Small string helpers shared across the project.
#pragma once
#include <string>
#include <string_view>

namespace nk {

// s without its leading and trailing ASCII white space (Python's str.strip(),
// Jinja's `trim` filter).
inline std::string trim(std::string_view s) {
  constexpr std::string_view ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(ws) - b + 1));
}

}  // namespace nk
