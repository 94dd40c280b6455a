#include "data/utf8.h"

#include <cstring>

namespace nk {

int utf8_sequence_length(const unsigned char* p, size_t n) {
  unsigned c = p[0];
  if (c < 0x80) return 1;
  // The valid range of the second byte depends on the lead byte (this is what
  // rules out overlong forms, surrogates and > U+10FFFF); later bytes are
  // always 80..BF (Unicode Table 3-7).
  int len;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return -1;  // 80..C1 or F5..FF can never start a sequence
  }
  for (int k = 1; k < len; ++k) {
    if (size_t(k) >= n) return -k;
    unsigned b = p[k];
    if (b < lo || b > hi) return -k;
    lo = 0x80, hi = 0xBF;
  }
  return len;
}

int64_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    int len = utf8_sequence_length(p + i, n - i);
    if (len < 0) return int64_t(i);
    i += size_t(len);
  }
  return -1;
}

namespace {

// Copies `s` to `out`, handing each maximal ill-formed subpart (its bytes) to
// `bad` to append in its place. Returns the number of subparts.
template <class Bad>
int64_t append_repairing(std::string_view s, std::string& out, Bad bad) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0, run = 0;  // [run, i) is valid and not yet copied
  int64_t replaced = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    int len = utf8_sequence_length(p + i, n - i);
    if (len > 0) {
      i += size_t(len);
      continue;
    }
    out.append(s.data() + run, i - run);
    bad(s.substr(i, size_t(-len)), out);
    ++replaced;
    i += size_t(-len);
    run = i;
  }
  out.append(s.data() + run, n - run);
  return replaced;
}

}  // namespace

int64_t append_replacing_invalid_utf8(std::string_view s, std::string& out) {
  return append_repairing(s, out,
                          [](std::string_view, std::string& o) { o.append("\xEF\xBF\xBD"); });
}

std::string escape_invalid_utf8(std::string_view s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  append_repairing(s, out, [](std::string_view bytes, std::string& o) {
    for (unsigned char c : bytes) o.append({'\\', 'x', hex[c >> 4], hex[c & 15]});
  });
  return out;
}

std::string replace_invalid_utf8(std::string_view s, int64_t* replaced) {
  std::string out;
  out.reserve(s.size());
  int64_t r = append_replacing_invalid_utf8(s, out);
  if (replaced) *replaced = r;
  return out;
}

}  // namespace nk
