#include "core/json.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace nk {

nlohmann::json parse_json(const std::string& text, const std::string& where) {
  auto line_of = [&](size_t byte) {
    size_t upto = std::min(text.size(), byte);
    return 1 + size_t(std::count(text.begin(), text.begin() + ptrdiff_t(upto), '\n'));
  };
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}:{}: not valid JSON (byte {}): {}", where, line_of(e.byte), e.byte, e.what());
  } catch (const nlohmann::json::exception& e) {
    // out_of_range.406: a number no double holds; nlohmann gives no position.
    fail("{}: not valid JSON: {}", where, e.what());
  }
}

nlohmann::json parse_json_object(const std::string& text, const std::string& where) {
  nlohmann::json j = parse_json(text, where);
  if (!j.is_object()) fail("{}: expected a JSON object", where);
  return j;
}

int64_t detail::checked_json_int(int kind, uint64_t u, int64_t i, double d, const std::string& text,
                                 const std::string& where, const std::string& key, int64_t lo,
                                 int64_t hi) {
  auto out_of_range = [&] {
    fail("{}: field '{}' is out of range [{}, {}], got {}", where, key, lo, hi, text);
  };
  int64_t r = 0;
  if (kind == 0) {
    if (u > uint64_t(INT64_MAX)) out_of_range();
    r = int64_t(u);
  } else if (kind == 1) {
    r = i;
  } else if (kind == 2) {
    if (!std::isfinite(d) || d != std::trunc(d))
      fail("{}: field '{}' must be an integer, got {}", where, key, text);
    // [-2^63, 2^63): the doubles that convert to int64 without undefined behaviour.
    if (d < -9223372036854775808.0 || d >= 9223372036854775808.0) out_of_range();
    r = int64_t(d);
  } else {
    fail("{}: field '{}' must be an integer, got {}", where, key, text);
  }
  if (r < lo || r > hi) out_of_range();
  return r;
}

void detail::fail_shape(const std::string& text, const std::string& where, const std::string& key) {
  fail("{}: field '{}' must be a list of at most {} sizes, got {}", where, key, limits::kTensorDims,
       text);
}

}  // namespace nk
