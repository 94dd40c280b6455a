#include "eval/py_text.h"

#include <unicode/uchar.h>
#include <unicode/utf8.h>

namespace nk {

bool py_isspace(int32_t c) {
  const UCharDirection d = u_charDirection(c);
  return u_charType(c) == U_SPACE_SEPARATOR || d == U_WHITE_SPACE_NEUTRAL ||
         d == U_BLOCK_SEPARATOR || d == U_SEGMENT_SEPARATOR;
}

namespace {

// [start, end) of s without leading (left) and trailing white space.
std::pair<int32_t, int32_t> stripped(const std::string& s, bool left) {
  const auto* b = reinterpret_cast<const uint8_t*>(s.data());
  const int32_t len = int32_t(s.size());
  int32_t start = 0, end = len;
  while (left && start < len) {
    int32_t i = start;
    UChar32 c;
    U8_NEXT(b, i, len, c);
    if (c < 0 || !py_isspace(c)) break;
    start = i;
  }
  while (end > start) {
    int32_t i = end;
    UChar32 c;
    U8_PREV(b, 0, i, c);
    if (c < 0 || !py_isspace(c)) break;
    end = i;
  }
  return {start, end};
}

}  // namespace

std::string py_strip(const std::string& s) {
  const auto [a, b] = stripped(s, true);
  return s.substr(size_t(a), size_t(b - a));
}

std::string py_rstrip(const std::string& s) {
  return s.substr(0, size_t(stripped(s, false).second));
}

int64_t code_points(const std::string& s) {
  int64_t n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
  return n;
}

int64_t count_words(const std::string& s) {
  int64_t pieces = 1;
  bool in_run = false;
  const auto* b = reinterpret_cast<const uint8_t*>(s.data());
  const int32_t len = int32_t(s.size());
  for (int32_t i = 0; i < len;) {
    UChar32 c;
    U8_NEXT(b, i, len, c);
    const bool sp = c >= 0 && py_isspace(c);
    if (sp && !in_run) ++pieces;
    in_run = sp;
  }
  return pieces;
}

}  // namespace nk
