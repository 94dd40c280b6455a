#include "curate/extract/clean.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "core/error.h"
#include "curate/stages.h"
#include "curate/words.h"

namespace nk::curate {

namespace {

// The byte Windows-1252 (or Latin-1, for its five undefined bytes and the C1
// range) decodes to `cp`, or -1.
int cp1252_byte(char32_t cp) {
  if (cp < 0x100) return int(cp);
  switch (cp) {
    case 0x20AC:
      return 0x80;
    case 0x201A:
      return 0x82;
    case 0x0192:
      return 0x83;
    case 0x201E:
      return 0x84;
    case 0x2026:
      return 0x85;
    case 0x2020:
      return 0x86;
    case 0x2021:
      return 0x87;
    case 0x02C6:
      return 0x88;
    case 0x2030:
      return 0x89;
    case 0x0160:
      return 0x8A;
    case 0x2039:
      return 0x8B;
    case 0x0152:
      return 0x8C;
    case 0x017D:
      return 0x8E;
    case 0x2018:
      return 0x91;
    case 0x2019:
      return 0x92;
    case 0x201C:
      return 0x93;
    case 0x201D:
      return 0x94;
    case 0x2022:
      return 0x95;
    case 0x2013:
      return 0x96;
    case 0x2014:
      return 0x97;
    case 0x02DC:
      return 0x98;
    case 0x2122:
      return 0x99;
    case 0x0161:
      return 0x9A;
    case 0x203A:
      return 0x9B;
    case 0x0153:
      return 0x9C;
    case 0x017E:
      return 0x9E;
    case 0x0178:
      return 0x9F;
    default:
      return -1;
  }
}

struct Repair {
  size_t begin, end;  // bytes of the mis-decoded characters
  char32_t cp;        // what they were
  int nbytes;         // UTF-8 length of cp
  bool accept = false;
};

bool is_letter(char32_t cp) {
  return (U_GET_GC_MASK(UChar32(cp)) & U_GC_L_MASK) != 0;
}

// One pass over the text; returns the number of characters repaired.
size_t fix_mojibake_once(std::string& text) {
  thread_local std::vector<Repair> found;
  found.clear();
  std::string_view s = text;
  // Every candidate starts with a character in U+00C2..U+00F4, which UTF-8
  // writes as C3 82..C3 B4: look for those bytes only.
  size_t at = 0;
  while (true) {
    const void* p = std::memchr(s.data() + at, 0xC3, s.size() - at);
    if (!p) break;
    size_t i = size_t(static_cast<const char*>(p) - s.data());
    at = i + 1;
    if (i + 1 >= s.size()) break;
    unsigned char b0 = static_cast<unsigned char>(s[i + 1]) + 0x40;  // C3 xx → U+00C0 + (xx-0x80)
    if (b0 < 0xC2 || b0 > 0xF4) continue;
    int need = b0 >= 0xF0 ? 3 : b0 >= 0xE0 ? 2 : 1;
    size_t j = i + 2;
    char32_t cp = b0 & (0x3F >> need);
    int k = 0;
    for (; k < need && j < s.size(); ++k) {
      size_t before = j;
      int b = cp1252_byte(next_code_point(s, j));
      if (b < 0x80 || b > 0xBF) {
        j = before;
        break;
      }
      // The second byte's range excludes overlongs and surrogates.
      if (k == 0 && ((b0 == 0xE0 && b < 0xA0) || (b0 == 0xED && b > 0x9F) ||
                     (b0 == 0xF0 && b < 0x90) || (b0 == 0xF4 && b > 0x8F)))
        break;
      cp = (cp << 6) | char32_t(b & 0x3F);
    }
    if (k != need) continue;
    found.push_back({i, j, cp, need + 1});
    at = j;
  }
  if (found.empty()) return 0;
  // Strong repairs first, then those that need company.
  size_t strong = 0;
  for (size_t r = 0; r < found.size(); ++r) {
    Repair& f = found[r];
    char32_t cp = f.cp;
    if (f.nbytes >= 3) {
      bool junk = (cp >= 0xE000 && cp <= 0xF8FF) || (cp >= 0xFDD0 && cp <= 0xFDEF) ||
                  (cp & 0xFFFE) == 0xFFFE || (cp >= 0xF0000);
      f.accept = !junk;
    } else if (cp < 0xA0) {
      f.accept = false;  // C1 controls: never what the text meant
    } else if (cp <= 0x17F) {
      f.accept = true;
    } else if (cp >= 0x300 && cp <= 0x36F) {
      // A combining mark after a letter (decomposed text): "eÌ\u0081" → "é".
      size_t b = f.begin;
      while (b > 0 && (static_cast<unsigned char>(s[b - 1]) & 0xC0) == 0x80) --b;
      size_t q = b;
      f.accept = b < f.begin && is_letter(next_code_point(s, q));
    } else {
      bool prev = r > 0 && found[r - 1].end == f.begin;
      bool next = r + 1 < found.size() && found[r + 1].begin == f.end;
      f.accept = prev || next;
    }
    strong += f.accept;
  }
  if (strong >= 2)
    for (Repair& f : found)
      if (!f.accept && f.cp >= 0x180 && f.nbytes == 2) f.accept = true;
  thread_local std::string out;
  out.clear();
  out.reserve(text.size());
  size_t copied = 0, fixed = 0;
  for (const Repair& f : found) {
    if (!f.accept) continue;
    out.append(s.data() + copied, f.begin - copied);
    append_utf8(f.cp, out);
    copied = f.end;
    ++fixed;
  }
  if (!fixed) return 0;
  out.append(s.data() + copied, s.size() - copied);
  text.swap(out);
  return fixed;
}

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

// The length of a Unicode space separator at s[i] (not U+3000), or 0.
inline size_t unicode_space(std::string_view s, size_t i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c == 0xC2) return i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0xA0 ? 2 : 0;
  if (i + 2 >= s.size()) return 0;
  unsigned char c1 = static_cast<unsigned char>(s[i + 1]),
                c2 = static_cast<unsigned char>(s[i + 2]);
  if (c == 0xE1) return c1 == 0x9A && c2 == 0x80 ? 3 : 0;
  if (c == 0xE2) {
    if (c1 == 0x80 && (c2 <= 0x8A || c2 == 0xAF)) return 3;
    if (c1 == 0x81 && c2 == 0x9F) return 3;
  }
  return 0;
}

// At most one blank line in a row, none at the ends (after line removals).
void collapse_blank_lines(std::string& s) {
  size_t w = 0, i = 0, n = s.size();
  int newlines = 0;
  while (i < n) {
    char c = s[i++];
    if (c == '\n') {
      ++newlines;
      continue;
    }
    if (w > 0 && newlines) {
      for (int k = 0; k < std::min(newlines, 2); ++k) s[w++] = '\n';
    }
    newlines = 0;
    s[w++] = c;
  }
  s.resize(w);
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = char(c + 32);
  return out;
}

inline bool word_byte(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         (static_cast<unsigned char>(c) >= 0x80);
}

}  // namespace

std::string nfc(std::string_view text) {
  if (is_ascii(text)) return std::string(text);
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(err);
  if (U_FAILURE(err)) fail("ICU: cannot load the NFC normaliser: {}", u_errorName(err));
  icu::StringPiece piece(text.data(), int32_t(text.size()));
  if (n->isNormalizedUTF8(piece, err) && U_SUCCESS(err)) return std::string(text);
  err = U_ZERO_ERROR;
  std::string out;
  out.reserve(text.size());
  icu::StringByteSink<std::string> sink(&out);
  n->normalizeUTF8(0, piece, sink, nullptr, err);
  if (U_FAILURE(err)) return std::string(text);
  return out;
}

size_t fix_mojibake(std::string& text) {
  size_t total = 0;
  // Text encoded wrongly twice needs two passes; three is plenty.
  for (int pass = 0; pass < 3; ++pass) {
    size_t n = fix_mojibake_once(text);
    if (!n) break;
    total += n;
  }
  return total;
}

size_t remove_control_chars(std::string& s) {
  size_t w = 0, removed = 0, n = s.size();
  for (size_t i = 0; i < n;) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = 0;  // bytes of a character to drop
    if (c < 0x20) {
      if (c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') len = 1;
    } else if (c == 0x7F) {
      len = 1;
    } else if (c == 0xC2 && i + 1 < n) {
      unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c1 >= 0x80 && c1 <= 0x9F) || c1 == 0xAD) len = 2;
    } else if ((c == 0xE2 || c == 0xEF) && i + 2 < n) {
      unsigned char c1 = static_cast<unsigned char>(s[i + 1]),
                    c2 = static_cast<unsigned char>(s[i + 2]);
      if ((c == 0xE2 && c1 == 0x80 && c2 == 0x8B) || (c == 0xE2 && c1 == 0x81 && c2 == 0xA0) ||
          (c == 0xEF && c1 == 0xBB && c2 == 0xBF))
        len = 3;
    }
    if (len) {
      i += len;
      ++removed;
      continue;
    }
    s[w++] = s[i++];
  }
  s.resize(w);
  return removed;
}

bool normalize_whitespace(std::string& text) {
  thread_local std::string out;
  out.clear();
  out.reserve(text.size());
  std::string_view s = text;
  size_t i = 0, n = s.size();
  int blank_lines = 0;  // blank lines since the last line with text
  while (i < n) {
    // The separator goes in first and comes out again if the line is blank.
    size_t line_start = out.size();
    bool first = out.empty();
    if (!first) out.append(blank_lines ? "\n\n" : "\n");
    size_t text_start = out.size();
    bool leading = true, space = false;
    while (i < n && s[i] != '\n' && s[i] != '\r') {
      char c = s[i];
      size_t u = static_cast<unsigned char>(c) >= 0x80 ? unicode_space(s, i) : 0;
      if (c == ' ' || c == '\f' || c == '\v' || u) {
        i += u ? u : 1;
        if (!leading)
          space = true;
        else if (!first)
          out.push_back(' ');  // indentation is kept
        continue;
      }
      if (c == '\t') {
        ++i;
        if (!leading || !first) out.push_back('\t');
        space = false;
        continue;
      }
      if (space && out.back() != '\t') out.push_back(' ');
      space = false;
      leading = false;
      // Copy a run of ordinary bytes at once.
      size_t j = i + 1;
      while (j < n) {
        unsigned char d = static_cast<unsigned char>(s[j]);
        if (d == ' ' || d == '\t' || d == '\n' || d == '\r' || d == '\f' || d == '\v' ||
            d == 0xC2 || d == 0xE1 || d == 0xE2)
          break;
        ++j;
      }
      out.append(s.data() + i, j - i);
      i = j;
    }
    if (i < n) {  // the line end: \r\n, \r or \n
      if (s[i] == '\r' && i + 1 < n && s[i + 1] == '\n') ++i;
      ++i;
    }
    while (out.size() > text_start && (out.back() == ' ' || out.back() == '\t')) out.pop_back();
    if (leading) {  // blank
      out.resize(line_start);
      ++blank_lines;
      continue;
    }
    blank_lines = 0;
  }
  if (out == text) return false;
  text.swap(out);
  return true;
}

size_t remove_repeated_lines(std::string& text, size_t min_bytes) {
  thread_local std::unordered_set<std::string_view> seen;
  thread_local std::string out;
  seen.clear();
  out.clear();
  out.reserve(text.size());
  std::string_view s = text;
  size_t removed = 0;
  for (size_t i = 0; i < s.size();) {
    size_t e = s.find('\n', i);
    if (e == std::string_view::npos) e = s.size();
    std::string_view line = s.substr(i, e - i);
    bool drop =
        !line.empty() && line.size() >= std::max<size_t>(min_bytes, 1) && !seen.insert(line).second;
    if (drop) {
      ++removed;
    } else {
      out.append(line);
      if (e < s.size()) out.push_back('\n');
    }
    i = e + 1;
  }
  seen.clear();
  if (!removed) return 0;
  collapse_blank_lines(out);
  text.swap(out);
  return removed;
}

size_t remove_boilerplate_lines(std::string& text, const std::vector<std::string>& phrases,
                                int max_words) {
  thread_local std::string out, lower;
  out.clear();
  out.reserve(text.size());
  std::string_view s = text;
  size_t removed = 0;
  for (size_t i = 0; i < s.size();) {
    size_t e = s.find('\n', i);
    if (e == std::string_view::npos) e = s.size();
    std::string_view line = s.substr(i, e - i);
    bool drop = false;
    // Count words up to max_words + 1 only: long lines are never boilerplate.
    int words = 0;
    bool in_word = false;
    for (size_t k = 0; k < line.size() && words <= max_words; ++k) {
      bool sp = line[k] == ' ' || line[k] == '\t';
      if (!sp && !in_word) ++words;
      in_word = !sp;
    }
    if (words > 0 && words <= max_words) {
      lower.assign(line);
      for (char& c : lower)
        if (c >= 'A' && c <= 'Z') c = char(c + 32);
      for (const std::string& p : phrases) {
        if (p.empty()) continue;
        for (size_t at = lower.find(p); at != std::string::npos; at = lower.find(p, at + 1)) {
          bool left = at == 0 || !word_byte(lower[at - 1]) || !word_byte(p.front());
          size_t end = at + p.size();
          bool right = end == lower.size() || !word_byte(lower[end]) || !word_byte(p.back());
          if (left && right) {
            drop = true;
            break;
          }
        }
        if (drop) break;
      }
    }
    if (drop) {
      ++removed;
    } else {
      out.append(line);
      if (e < s.size()) out.push_back('\n');
    }
    i = e + 1;
  }
  if (!removed) return 0;
  collapse_blank_lines(out);
  text.swap(out);
  return removed;
}

const std::vector<std::string>& default_boilerplate_phrases() {
  static const std::vector<std::string> phrases = {"all rights reserved",
                                                   "cookie",
                                                   "cookies",
                                                   "privacy policy",
                                                   "terms of use",
                                                   "terms of service",
                                                   "terms and conditions",
                                                   "subscribe to our newsletter",
                                                   "sign in",
                                                   "sign up",
                                                   "log in",
                                                   "log out",
                                                   "share this",
                                                   "share on",
                                                   "follow us",
                                                   "click here",
                                                   "skip to content",
                                                   "skip to main content",
                                                   "back to top",
                                                   "powered by",
                                                   "accept all",
                                                   "javascript is disabled",
                                                   "enable javascript",
                                                   "read more",
                                                   "leave a comment",
                                                   "previous post",
                                                   "next post"};
  return phrases;
}

void clean_text(std::string& text, const CleanOptions& opt, Counters& counts) {
  if (opt.fix_mojibake)
    if (size_t n = fix_mojibake(text)) counts["mojibake_fixed"] += int64_t(n);
  if (opt.control_chars)
    if (size_t n = remove_control_chars(text)) counts["control_chars_removed"] += int64_t(n);
  if (opt.nfc && !is_ascii(text)) {
    std::string t = nfc(text);
    if (t != text) {
      text.swap(t);
      counts["nfc_changed"] += 1;
    }
  }
  if (opt.whitespace && normalize_whitespace(text)) counts["whitespace_changed"] += 1;
  if (opt.repeated_lines)
    if (size_t n = remove_repeated_lines(text, opt.repeated_min_chars))
      counts["lines_removed_repeated"] += int64_t(n);
  if (opt.boilerplate_lines)
    if (size_t n =
            remove_boilerplate_lines(text, opt.boilerplate_phrases, opt.boilerplate_max_words))
      counts["lines_removed_boilerplate"] += int64_t(n);
}

namespace {

class CleanStage : public DocStage {
 public:
  explicit CleanStage(CleanOptions opt) : opt_(std::move(opt)) {}
  Verdict apply(Document& doc, Counters& counts) const override {
    clean_text(doc.text, opt_, counts);
    bool empty = std::all_of(doc.text.begin(), doc.text.end(), [](char c) {
      return c == ' ' || c == '\n' || c == '\t' || c == '\r';
    });
    if (empty) return Verdict::removed("empty after cleaning");
    return Verdict::kept();
  }

 private:
  CleanOptions opt_;
};

}  // namespace

void register_clean_stages(StageRegistry& r) {
  r.add({"clean",
         "normalise text: mojibake, control characters, NFC, whitespace, repeated and "
         "boilerplate lines",
         [](StageConfig& c) -> std::unique_ptr<DocStage> {
           CleanOptions o;
           c.bind("nfc", o.nfc, "normalise to Unicode NFC");
           c.bind("fix_mojibake", o.fix_mojibake, "repair UTF-8 decoded as Windows-1252");
           c.bind("control_chars", o.control_chars, "remove control and invisible characters");
           c.bind("whitespace", o.whitespace, "normalise spaces, line ends and blank lines");
           c.bind("repeated_lines", o.repeated_lines, "drop repeats of a line");
           c.bind("repeated_min_chars", o.repeated_min_chars,
                  "lines shorter than this (bytes) are never repeats");
           if (o.repeated_min_chars < 1) c.fail_key("repeated_min_chars", "must be at least 1");
           c.bind("boilerplate_lines", o.boilerplate_lines,
                  "drop short lines holding a boilerplate phrase");
           c.bind("boilerplate_max_words", o.boilerplate_max_words,
                  "longest line (words) dropped as boilerplate");
           if (o.boilerplate_max_words < 1 || o.boilerplate_max_words > 1000)
             c.fail_key("boilerplate_max_words", "must be between 1 and 1000");
           std::vector<std::string> phrases = o.boilerplate_phrases;
           c.bind("boilerplate_phrases", phrases,
                  "phrases that mark a line as boilerplate (ASCII case ignored)");
           o.boilerplate_phrases.clear();
           for (const std::string& p : phrases) {
             if (p.empty()) c.fail_key("boilerplate_phrases", "phrases must not be empty");
             o.boilerplate_phrases.push_back(ascii_lower(p));
           }
           return std::make_unique<CleanStage>(std::move(o));
         },
         nullptr});
}

}  // namespace nk::curate
