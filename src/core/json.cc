#include "core/json.h"

#include <algorithm>

#include "core/error.h"

namespace nk {

nlohmann::json parse_json(const std::string& text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    size_t upto = std::min(text.size(), size_t(e.byte));
    size_t line = 1 + size_t(std::count(text.begin(), text.begin() + ptrdiff_t(upto), '\n'));
    fail("{}:{}: not valid JSON (byte {}): {}", where, line, e.byte, e.what());
  }
}

nlohmann::json parse_json_object(const std::string& text, const std::string& where) {
  nlohmann::json j = parse_json(text, where);
  if (!j.is_object()) fail("{}: expected a JSON object", where);
  return j;
}

}  // namespace nk
