#include "data/jinja/js_text.h"

#include <unicode/locid.h>
#include <unicode/ucol.h>
#include <unicode/unistr.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace nk::jinja {
namespace {

// The code point at s[i] and its byte length; an invalid byte reads as
// U+FFFD of length 1 (the strings here come from parsed JSON: valid).
char32_t decode(std::string_view s, size_t i, size_t& len) {
  const auto c = static_cast<unsigned char>(s[i]);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + size_t(n) > s.size()) {
    len = 1;
    return c < 0x80 ? c : 0xFFFD;
  }
  char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + size_t(k)]);
    if ((d & 0xC0) != 0x80) {
      len = 1;
      return 0xFFFD;
    }
    cp = (cp << 6) | (d & 0x3F);
  }
  len = size_t(n);
  return cp;
}

bool js_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000 || c == 0xFEFF;
}

bool ascii_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

std::string from_unicode(const icu::UnicodeString& u) {
  std::string out;
  u.toUTF8String(out);
  return out;
}

// The longest prefix of s (after white space) that parseFloat reads, or "".
std::string_view float_prefix(std::string_view s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  if (s.substr(i).starts_with("Infinity")) return s.substr(0, i + 8);
  const size_t digits_from = i;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  size_t mantissa = i - digits_from;
  if (i < s.size() && s[i] == '.') {
    size_t j = i + 1;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    mantissa += j - i - 1;
    if (mantissa > 0) i = j;
  }
  if (mantissa == 0) return {};
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    const size_t exp_from = j;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    if (j > exp_from) i = j;
  }
  return s.substr(0, i);
}

double parse_prefix(std::string_view p) {
  if (p.ends_with("Infinity")) return p[0] == '-' ? -INFINITY : INFINITY;
  return std::strtod(std::string(p).c_str(), nullptr);
}

}  // namespace

size_t space_at(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  size_t len = 0;
  const char32_t c = decode(s, i, len);
  return js_space(c) ? len : 0;
}

std::string_view trim_start(std::string_view s) {
  size_t i = 0;
  for (size_t n; (n = space_at(s, i)) > 0;) i += n;
  return s.substr(i);
}

std::string_view trim_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;  // the start of the last character
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && end - start < 4)
      --start;
    if (space_at(s.substr(0, end), start) != end - start) break;
    end = start;
  }
  return s.substr(0, end);
}

std::string_view trim(std::string_view s) {
  return trim_end(trim_start(s));
}

std::string js_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v < 0 ? "-Infinity" : "Infinity";
  if (v == 0) return "0";
  // The shortest digits that round-trip, and the decimal exponent: v is
  // 0.DIGITS * 10^n.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, std::abs(v), std::chars_format::scientific);
  const std::string sci(buf, r.ptr);  // d.ddde+XX
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, 1) + (e > 2 ? sci.substr(2, e - 2) : "");
  const int n = std::atoi(sci.c_str() + e + 1) + 1;
  const int k = int(digits.size());
  std::string out = v < 0 ? "-" : "";
  // (Appends only: GCC 12 warns falsely on "literal" + string here.)
  if (k <= n && n <= 21) {
    out.append(digits).append(size_t(n - k), '0');
  } else if (0 < n && n <= 21) {
    out.append(digits, 0, size_t(n)).append(1, '.').append(digits, size_t(n));
  } else if (-6 < n && n <= 0) {
    out.append("0.").append(size_t(-n), '0').append(digits);
  } else {
    out.append(digits, 0, 1);
    if (k > 1) out.append(1, '.').append(digits, 1);
    out.append(fmt::format("e{}{}", n - 1 >= 0 ? "+" : "-", std::abs(n - 1)));
  }
  return out;
}

bool js_parse_int(std::string_view s, double& out) {
  s = trim_start(s);
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  const size_t from = i;
  double v = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') v = v * 10 + (s[i++] - '0');
  if (i == from) return false;
  out = neg ? -v : v;
  return true;
}

bool js_parse_float(std::string_view s, double& out) {
  const std::string_view p = float_prefix(trim_start(s));
  if (p.empty()) return false;
  out = parse_prefix(p);
  return true;
}

double js_to_number(std::string_view s) {
  s = trim(s);
  if (s.empty()) return 0;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    double v = 0;
    for (char c : s.substr(2)) {
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) return NAN;
      v = v * 16 + d;
    }
    return v;
  }
  const std::string_view p = float_prefix(s);
  if (p.size() != s.size()) return NAN;
  return parse_prefix(p);
}

size_t utf16_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0, len = 0; i < s.size(); i += len) n += decode(s, i, len) > 0xFFFF ? 2 : 1;
  return n;
}

std::vector<std::string_view> characters(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0, len = 0; i < s.size(); i += len) {
    decode(s, i, len);
    out.push_back(s.substr(i, len));
  }
  return out;
}

std::string to_upper(std::string_view s) {
  icu::UnicodeString u =
      icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), int32_t(s.size())));
  return from_unicode(u.toUpper(icu::Locale::getRoot()));
}

std::string to_lower(std::string_view s) {
  icu::UnicodeString u =
      icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), int32_t(s.size())));
  return from_unicode(u.toLower(icu::Locale::getRoot()));
}

std::string title_case(std::string_view s) {
  std::string out(s);
  for (size_t i = 0; i < out.size(); ++i)
    if (ascii_word(out[i]) && (i == 0 || !ascii_word(out[i - 1])) && out[i] >= 'a' && out[i] <= 'z')
      out[i] = char(out[i] - 'a' + 'A');
  return out;
}

std::string capitalize(std::string_view s) {
  if (s.empty()) return "";
  size_t len = 0;
  decode(s, 0, len);
  return to_upper(s.substr(0, len)) + std::string(s.substr(len));
}

void json_quote(std::string_view s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0, len = 0; i < s.size(); i += len) {
    const char32_t c = decode(s, i, len);
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      default:
        break;
    }
    if (c < 0x20) {
      out += fmt::format("\\u{:04x}", uint32_t(c));
    } else if (ensure_ascii && c >= 0x7F) {
      if (c > 0xFFFF) {
        const uint32_t v = uint32_t(c) - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        out += fmt::format("\\u{:04x}", uint32_t(c));
      }
    } else {
      out += s.substr(i, len);
    }
  }
  out += '"';
}

int locale_compare(std::string_view a, std::string_view b) {
  // One collator per thread: a UCollator is not to be shared while in use.
  struct Collator {
    UCollator* c = nullptr;
    Collator() {
      UErrorCode status = U_ZERO_ERROR;
      c = ucol_open("", &status);
      if (U_FAILURE(status)) c = nullptr;
    }
    ~Collator() {
      if (c) ucol_close(c);
    }
  };
  thread_local const Collator coll;
  if (!coll.c) return a.compare(b);
  UErrorCode status = U_ZERO_ERROR;
  const UCollationResult r =
      ucol_strcollUTF8(coll.c, a.data(), int32_t(a.size()), b.data(), int32_t(b.size()), &status);
  if (U_FAILURE(status)) return a.compare(b);
  return r == UCOL_LESS ? -1 : r == UCOL_GREATER ? 1 : 0;
}

}  // namespace nk::jinja
