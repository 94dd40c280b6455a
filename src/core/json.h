// Parsing JSON text with errors that name the file and line: one helper for
// every JSON file Nekton reads (configs, tokenizer files, trainer state).
//
// One rule for a key given twice in an object: the last one wins, as in
// Python's json module and Megatron's tools (nlohmann's parser already does
// this; the simdjson readers of JSONL follow it too).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/limits.h"

namespace nk {

// Why a JSON text does not parse, in a user's words: where (1-based line and
// column, the byte offset, the key or index being read as a path like
// `a.b[2]`, "" at the top) and what, never the JSON library's internal
// wording ("[json.exception.parse_error.101] ...").
struct JsonFault {
  size_t byte = 0, line = 1, column = 1;  // byte: 1-based, as line and column
  size_t token_size = 0;                  // of a number too large, else 0
  std::string path;
  std::string what;  // "the number 1e400 is beyond a double's range", "syntax error ..."
  // "LINE:COLUMN (key 'PATH'): WHAT", for messages that put the file before it.
  std::string describe() const;
};
// nullopt when `text` is valid JSON.
std::optional<JsonFault> json_fault(std::string_view text);

// nk::Error "WHERE:LINE: not valid JSON (column C, byte B, key 'n_layer'): the
// number 1e400 is beyond a double's range" on a syntax error, and on a number
// beyond a double's range (json_fault).
nlohmann::json parse_json(const std::string& text, const std::string& where);
// As parse_json, and nk::Error "WHERE: expected a JSON object" unless it is one.
nlohmann::json parse_json_object(const std::string& text, const std::string& where);

// obj[key] when obj is an object that has it, else a null value (the
// optional fields of a file read by hand: tokenizer.json's parts).
const nlohmann::json& json_member(const nlohmann::json& obj, const char* key);

// `v` read as an integer in [lo, hi]: an integer, or a float with no
// fractional part (4.0). Anything else is nk::Error "WHERE: field 'KEY' must
// be an integer, got 1.9" or "... is out of range [lo, hi], got 1e30": never
// a silent truncation or an undefined cast.
// Either flavour of nlohmann's json (ordered or not).
template <class Json>
int64_t json_int(const Json& v, const std::string& where, const std::string& key,
                 int64_t lo = INT64_MIN, int64_t hi = INT64_MAX);

namespace detail {
// json_int's checks on a number already taken apart; `text` is the value as
// JSON, for the message.
int64_t checked_json_int(int kind, uint64_t u, int64_t i, double d, const std::string& text,
                         const std::string& where, const std::string& key, int64_t lo, int64_t hi);
[[noreturn]] void fail_shape(const std::string& text, const std::string& where,
                             const std::string& key);
}  // namespace detail

template <class Json>
int64_t json_int(const Json& v, const std::string& where, const std::string& key, int64_t lo,
                 int64_t hi) {
  // kind: 0 unsigned, 1 signed, 2 float, 3 not a number.
  const int kind = v.is_number_unsigned()  ? 0
                   : v.is_number_integer() ? 1
                   : v.is_number_float()   ? 2
                                           : 3;
  return detail::checked_json_int(
      kind, kind == 0 ? v.template get<uint64_t>() : 0, kind == 1 ? v.template get<int64_t>() : 0,
      kind == 2 ? v.template get<double>() : 0.0, v.dump(), where, key, lo, hi);
}

// A tensor shape: a list of at most limits::kTensorDims integers >= 0 whose
// product is at most limits::kElements; nk::Error naming WHERE and KEY otherwise.
template <class Json>
std::vector<int64_t> json_shape(const Json& v, const std::string& where, const std::string& key) {
  if (!v.is_array() || int64_t(v.size()) > limits::kTensorDims)
    detail::fail_shape(v.dump(), where, key);
  std::vector<int64_t> shape;
  int64_t n = 1;
  for (const auto& d : v) {
    shape.push_back(json_int(d, where, key, 0, limits::kElements));
    n = checked_mul(n, shape.back(), key.c_str());
  }
  check_limit(where, key, n, limits::kElements, "elements");
  return shape;
}

}  // namespace nk
