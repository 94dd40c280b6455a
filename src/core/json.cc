#include "core/json.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace nk {

namespace {

// Follows the SAX events to know which key or array element is being read
// when the parser gives up.
class PathTracker : public nlohmann::json_sax<nlohmann::json> {
 public:
  std::optional<JsonFault> fault;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    stack_.push_back({true, "", 0});
    return true;
  }
  bool key(string_t& k) override {
    stack_.back().key = k;
    return true;
  }
  bool end_object() override {
    stack_.pop_back();
    return value();
  }
  bool start_array(std::size_t) override {
    stack_.push_back({false, "", 0});
    return true;
  }
  bool end_array() override {
    stack_.pop_back();
    return value();
  }
  bool parse_error(std::size_t position, const std::string& token,
                   const nlohmann::detail::exception& e) override {
    JsonFault f;
    f.byte = position;
    f.path = path();
    const std::string what = e.what();
    if (e.id == 406) {
      f.what = fmt::format("the number {} is beyond a double's range", token);
      f.token_size = token.size();
    } else {
      // "[json.exception.parse_error.101] parse error at line 1, column 5:
      // syntax error while parsing value - invalid literal; last read: 'x'":
      // the part after the position, less the echo of the bytes read.
      std::string m = what.substr(std::min(what.find("] ") + 2, what.size()));
      if (size_t colon = m.find(": "); m.starts_with("parse error") && colon != std::string::npos)
        m = m.substr(colon + 2);
      f.what = m.substr(0, m.find("; last read"));
    }
    fault = f;
    return false;
  }

 private:
  struct Frame {
    bool object;
    std::string key;
    size_t index;  // arrays: values read so far (the one being read is this one)
  };
  // A value ended: the array it was in moves to its next element.
  bool value() {
    if (!stack_.empty() && !stack_.back().object) ++stack_.back().index;
    return true;
  }
  std::string path() const {
    std::string p;
    for (const Frame& f : stack_) {
      if (!f.object)
        p += fmt::format("[{}]", f.index);
      else if (!f.key.empty())
        p += (p.empty() ? "" : ".") + f.key;
    }
    return p;
  }
  std::vector<Frame> stack_;
};

}  // namespace

std::string JsonFault::describe() const {
  return fmt::format("{}:{}{}: {}", line, column,
                     path.empty() ? std::string() : fmt::format(" (key '{}')", path), what);
}

std::optional<JsonFault> json_fault(std::string_view text) {
  PathTracker t;
  nlohmann::json::sax_parse(text, &t);
  if (!t.fault) return std::nullopt;
  JsonFault f = *t.fault;
  // f.byte holds the parser's count of bytes read; the place named is the
  // first byte of the offending token (a number too large), else the byte the
  // parser stopped at.
  const size_t read = std::min(text.size(), f.byte);
  const size_t at =
      read >= f.token_size && f.token_size > 0 ? read - f.token_size : (read > 0 ? read - 1 : 0);
  f.byte = at + 1;
  f.line = 1 + size_t(std::count(text.begin(), text.begin() + ptrdiff_t(at), '\n'));
  size_t start = 0;
  if (at > 0) {
    const size_t nl = text.rfind('\n', at - 1);
    start = nl == std::string_view::npos ? 0 : nl + 1;
  }
  f.column = at - start + 1;
  return f;
}

nlohmann::json parse_json(const std::string& text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    // A syntax error, or out_of_range.406 (a number no double holds, for
    // which nlohmann gives no position): told again with where and what.
  }
  const std::optional<JsonFault> f = json_fault(text);
  if (!f) fail("{}: not valid JSON", where);  // the two parsers disagree: never seen
  fail("{}:{}: not valid JSON (column {}, byte {}{}): {}", where, f->line, f->column, f->byte,
       f->path.empty() ? std::string() : ", key '" + f->path + "'", f->what);
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

const nlohmann::json& json_member(const nlohmann::json& obj, const char* key) {
  static const nlohmann::json absent;
  if (!obj.is_object()) return absent;
  auto it = obj.find(key);
  return it == obj.end() ? absent : *it;
}

}  // namespace nk
