// Text operations as the JavaScript reference (@huggingface/jinja) performs
// them, on UTF-8: JavaScript's white space (\s and trim(), which take in
// U+00A0, U+2028, U+FEFF, ...), its number formatting, parseInt/parseFloat,
// UTF-16 lengths, Unicode case mapping (through ICU, locale independent as
// toUpperCase is), JSON string quoting and localeCompare.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace nk::jinja {

// The byte length of the JavaScript white-space character at s[i], 0 if
// s[i] starts none.
size_t space_at(std::string_view s, size_t i);
std::string_view trim_start(std::string_view s);
std::string_view trim_end(std::string_view s);
std::string_view trim(std::string_view s);

// Number.prototype.toString: shortest round-trip digits, exponent form
// below 1e-6 and from 1e21 ("1e+21"), "NaN", "Infinity".
std::string js_number(double v);
// parseInt(s, 10) and parseFloat(s): false for NaN.
bool js_parse_int(std::string_view s, double& out);
bool js_parse_float(std::string_view s, double& out);
// Number(s): NaN for what is not a number ("" is 0).
double js_to_number(std::string_view s);

// The string's length in UTF-16 code units (JavaScript's .length).
size_t utf16_length(std::string_view s);
// The string split into its characters (code points), as Array.from does.
std::vector<std::string_view> characters(std::string_view s);

std::string to_upper(std::string_view s);
std::string to_lower(std::string_view s);
// The reference's title(): an ASCII word character after a non-word one
// (or at the start) upper-cased, nothing lower-cased.
std::string title_case(std::string_view s);
// The first character upper-cased, the rest as it is.
std::string capitalize(std::string_view s);

// JSON.stringify of a string; ensure_ascii escapes every UTF-16 unit from
// 0x7F as \uXXXX.
void json_quote(std::string_view s, bool ensure_ascii, std::string& out);

// String.prototype.localeCompare (ICU root collation): <0, 0, >0.
int locale_compare(std::string_view a, std::string_view b);

}  // namespace nk::jinja
