// Rules from NeMo Curator's heuristic filters
// (nemo_curator/filters/heuristic_filter.py), with its key names and
// defaults: UrlsFilter max_url_to_text_ratio 0.2, NonAlphaNumericFilter
// max_non_alpha_numeric_to_text_ratio 0.25, BoilerPlateStringFilter
// max_boilerplate_string_ratio 0.4 and remove_if_at_top_or_bottom true.
#include <fmt/format.h>
#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <array>

#include "curate/filters/filters.h"

namespace nk::curate {

namespace {

// NeMo's regex_url character class after "http[s]?://": ASCII letters and
// digits, the range '$'..'_' (which holds most ASCII punctuation), ! * ( ) ,
// and %XX. It stops at spaces, quotes ("), #, `, {, |, }, ~ and non-ASCII.
inline bool is_url_char(unsigned char c) {
  return (c >= '$' && c <= '_') || (c >= 'a' && c <= 'z') || c == '!';
}

// Bytes (= code points: URLs here are ASCII) inside http:// and https:// URLs.
size_t url_chars(std::string_view t) {
  size_t total = 0, i = 0;
  while ((i = t.find("http", i)) != std::string_view::npos) {
    size_t j = i + 4;
    if (j < t.size() && t[j] == 's') ++j;
    if (t.substr(j, 3) != "://") {
      i += 4;
      continue;
    }
    j += 3;
    size_t k = j;
    while (k < t.size() && is_url_char(static_cast<unsigned char>(t[k]))) ++k;
    if (k > j) total += k - i;
    i = k;
  }
  return total;
}

// The policy phrases of C4 plus NeMo's "privacy overview" and the two
// "privacy and cookies policy" spellings (nemo_curator/utils/constants.py).
constexpr std::array<std::string_view, 9> kBoilerplate = {
    "terms of use",     "privacy policy",           "cookie policy",
    "uses cookies",     "use of cookies",           "use cookies",
    "privacy overview", "privacy & cookies policy", "privacy and cookies policy"};

}  // namespace

void UrlRatioRule::read(StageConfig& c) {
  read_ratio(c, "max_url_to_text_ratio", max_ratio, "most characters in URLs kept");
}

Reason UrlRatioRule::check(const Document&, TextView& v, Counters&) const {
  if (v.words().empty()) return std::string("url_ratio: no words");
  double r = double(url_chars(v.text())) / double(v.chars());
  if (r > max_ratio) return fmt::format("url_ratio {} > {}", ratio_str(r), max_ratio);
  return {};
}

void NonAlphaNumericRule::read(StageConfig& c) {
  read_ratio(c, "max_non_alpha_numeric_to_text_ratio", max_ratio,
             "most non-alphanumeric characters kept");
}

// NeMo counts [a-zA-Z0-9\n?!,.] as "alphanumeric", ASCII only; we count every
// Unicode letter and digit (deviation: otherwise all Chinese, Russian or Thai
// text would be removed), plus newline and ? ! , . as NeMo does.
Reason NonAlphaNumericRule::check(const Document&, TextView& v, Counters&) const {
  if (v.words().empty()) return std::string("non_alphanumeric: no words");
  std::string_view t = v.text();
  size_t n = 0, alnum = 0;
  for (int32_t i = 0; i < int32_t(t.size());) {
    unsigned char b = static_cast<unsigned char>(t[size_t(i)]);
    ++n;
    if (b < 0x80) {
      ++i;
      alnum += ((b | 0x20) >= 'a' && (b | 0x20) <= 'z') || (b >= '0' && b <= '9') || b == '\n' ||
               b == '?' || b == '!' || b == ',' || b == '.';
      continue;
    }
    UChar32 c;
    U8_NEXT(t.data(), i, int32_t(t.size()), c);
    alnum += c >= 0 && (u_isalpha(c) || u_isdigit(c) || (U_GET_GC_MASK(c) & U_GC_M_MASK));
  }
  double r = double(n - alnum) / double(n);
  if (r > max_ratio) return fmt::format("non_alphanumeric {} > {}", ratio_str(r), max_ratio);
  return {};
}

void BoilerplateStringsRule::read(StageConfig& c) {
  read_ratio(c, "max_boilerplate_string_ratio", max_ratio, "most paragraphs with boilerplate kept");
  c.bind("remove_if_at_top_or_bottom", remove_if_at_top_or_bottom,
         "remove documents whose first or last paragraph is boilerplate");
}

// Paragraphs are text.split("\n\n") as in NeMo. "lorem ipsum" anywhere removes
// the document; so does a share of boilerplate paragraphs above the ratio and,
// with remove_if_at_top_or_bottom, boilerplate in the first or last paragraph
// (NeMo declares that switch; its scorer computes only the ratio).
Reason BoilerplateStringsRule::check(const Document&, TextView& v, Counters&) const {
  if (v.words().empty()) return std::string("boilerplate_strings: no words");
  std::string_view t = v.text();
  size_t paragraphs = 0, hits = 0;
  bool first_hit = false, last_hit = false;
  size_t start = 0;
  while (true) {
    size_t end = t.find("\n\n", start);
    std::string_view p =
        t.substr(start, end == std::string_view::npos ? t.size() - start : end - start);
    if (contains_ascii_ci(p, "lorem ipsum")) return std::string("boilerplate_strings: lorem ipsum");
    bool hit = false;
    for (std::string_view b : kBoilerplate)
      if (contains_ascii_ci(p, b)) {
        hit = true;
        break;
      }
    if (paragraphs == 0) first_hit = hit;
    last_hit = hit;
    hits += hit;
    ++paragraphs;
    if (end == std::string_view::npos) break;
    start = end + 2;
  }
  double r = double(hits) / double(paragraphs);
  if (r > max_ratio) return fmt::format("boilerplate_paragraphs {} > {}", ratio_str(r), max_ratio);
  if (remove_if_at_top_or_bottom && first_hit)
    return std::string("boilerplate_strings: in the first paragraph");
  if (remove_if_at_top_or_bottom && last_hit)
    return std::string("boilerplate_strings: in the last paragraph");
  return {};
}

}  // namespace nk::curate
