// Hand-written PII scanners. Each scanner is one left-to-right pass that tries
// a match only where a token starts (the byte before is not part of the same
// kind of token) or at an anchor byte ('@', "://"), and each attempt reads at
// most a bounded stretch or the rest of one token, so every scanner is linear.
#include "curate/filters/pii.h"

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "curate/stages.h"

namespace nk::curate {

namespace {

inline bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
inline bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
inline bool is_alnum(char c) {
  return is_digit(c) || is_alpha(c);
}
inline bool is_hex(char c) {
  return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
}
// Letters of other scripts glue to numbers as much as ASCII letters do.
inline bool is_wordish(char c) {
  return is_alnum(c) || static_cast<unsigned char>(c) >= 0x80 || c == '_';
}
inline bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// ---- URLs with credentials: scheme://user:password@host... ------------------------

inline bool is_scheme_char(char c) {
  return is_alnum(c) || c == '+' || c == '-' || c == '.';
}
inline bool ends_url(char c) {
  return is_space(c) || c == '"' || c == '\'' || c == '<' || c == '>' || c == '`';
}

void scan_url_credentials(std::string_view t, std::vector<PiiMatch>& out) {
  size_t p = 0;
  while ((p = t.find("://", p)) != std::string_view::npos) {
    size_t s = p;
    while (s > 0 && is_scheme_char(t[s - 1]) && p - s < 32) --s;
    while (s < p && !is_alpha(t[s])) ++s;  // a scheme starts with a letter
    size_t u = p + 3, j = u;
    bool colon = false;
    while (j < t.size() && t[j] != '@' && t[j] != '/' && t[j] != '?' && t[j] != '#' &&
           !ends_url(t[j])) {
      colon |= t[j] == ':';
      ++j;
    }
    if (s == p || j >= t.size() || t[j] != '@' || !colon || t[u] == ':') {
      p = std::max(j, p + 3);
      continue;
    }
    size_t e = j + 1;
    while (e < t.size() && !ends_url(t[e])) ++e;
    while (e > j + 1 && std::string_view(".,;:!?)]}").find(t[e - 1]) != std::string_view::npos) --e;
    if (e > j + 1) out.push_back({s, e, PiiType::UrlWithCredentials});
    p = e;
  }
}

// ---- E-mail addresses -------------------------------------------------------------

// Letters, digits, "._%+-" and the apostrophe (o'brien@, d'angelo@). RFC
// 5322's atext allows more ("!#$&*/=?^`{|}~"), but in text those join an
// address to what precedes it far more often than they belong to it: GNU
// ChangeLogs' "2020-05-11T00:40:14Z!karl@...", procmail's ".*debian-user-
// request@...", a URL query's "?to=a@...", LaTeX's "\email{a@...}".
inline bool is_local_char(char c) {
  return is_alnum(c) || c == '.' || c == '_' || c == '%' || c == '+' || c == '-' || c == '\'';
}
// A local part starts with a letter, digit or '_' as found in running text:
// a quote before it belongs to the sentence ('bob@x.org').
inline bool starts_local_part(char c) {
  return is_alnum(c) || c == '_';
}
inline bool is_domain_char(char c) {
  return is_alnum(c) || c == '-' || c == '.';
}

void scan_emails(std::string_view t, std::vector<PiiMatch>& out) {
  size_t a = 0;
  while ((a = t.find('@', a)) != std::string_view::npos) {
    size_t s = a;
    while (s > 0 && is_local_char(t[s - 1]) && a - s <= 64) --s;
    size_t e = a + 1;
    while (e < t.size() && is_domain_char(t[e]) && e - a <= 255) ++e;
    size_t next = e;
    // A local part longer than 64 or glued to a letter of another script is no address.
    bool ok = a - s <= 64 && (s == 0 || !is_wordish(t[s - 1]));
    while (s < a && !starts_local_part(t[s])) ++s;
    ok = ok && s < a && t[a - 1] != '.';
    // The domain: labels of letters, digits and inner hyphens; a trailing '.'
    // or '-' belongs to the sentence; the last label is 2+ letters.
    while (e > a + 1 && (t[e - 1] == '.' || t[e - 1] == '-')) --e;
    std::string_view dom = t.substr(a + 1, e - a - 1);
    size_t last_dot = dom.rfind('.');
    ok = ok && !dom.empty() && last_dot != std::string_view::npos && e - a <= 254;
    if (ok) {
      size_t start = 0;
      while (ok) {
        size_t dot = dom.find('.', start);
        std::string_view label =
            dom.substr(start, dot == std::string_view::npos ? dom.npos : dot - start);
        ok = !label.empty() && label.front() != '-' && label.back() != '-';
        if (dot == std::string_view::npos) break;
        start = dot + 1;
      }
      std::string_view tld = dom.substr(last_dot + 1);
      ok = ok && tld.size() >= 2 && std::all_of(tld.begin(), tld.end(), is_alpha);
    }
    if (ok && e < t.size() && is_wordish(t[e])) ok = false;
    if (ok) out.push_back({s, e, PiiType::Email});
    a = std::max(next, a + 1);
  }
}

// ---- Numbers: credit cards, SSNs, phone numbers, IPv4 ------------------------------

// A number may start here: the byte before is not part of a word or a number.
inline bool number_boundary(std::string_view t, size_t i) {
  if (i == 0) return true;
  char p = t[i - 1];
  if (is_wordish(p) || p == '-' || p == '+' || p == '/' || p == '@' || p == '$') return false;
  if ((p == '.' || p == ',' || p == ':') && i >= 2 && is_digit(t[i - 2])) return false;
  return true;
}

// A number may end here: the byte after is not a digit, letter, or a '-', '.'
// or ',' followed by a digit (which would make it part of a longer number).
inline bool number_end(std::string_view t, size_t e) {
  if (e >= t.size()) return true;
  char c = t[e];
  if (is_wordish(c) || c == '@') return false;
  if ((c == '-' || c == '.' || c == ',' || c == '/') && e + 1 < t.size() && is_digit(t[e + 1]))
    return false;
  return true;
}

size_t digits_at(std::string_view t, size_t i, size_t max) {
  size_t n = 0;
  while (i + n < t.size() && n < max + 1 && is_digit(t[i + n])) ++n;
  return n;
}

bool luhn_ok(std::string_view digits) {
  int sum = 0;
  bool dbl = false;
  for (size_t i = digits.size(); i-- > 0;) {
    int d = digits[i] - '0';
    if (dbl) d = d * 2 > 9 ? d * 2 - 9 : d * 2;
    sum += d;
    dbl = !dbl;
  }
  return sum % 10 == 0;
}

// 13 to 19 digits, in one run or in groups of 3 to 6 split by single spaces or
// single dashes (one kind per number), with a valid Luhn checksum. The longest
// valid prefix of groups wins.
bool match_credit_card(std::string_view t, size_t i, size_t& end) {
  char digits[20];
  size_t nd = 0, j = i, best = 0;
  char sep = 0;
  while (true) {
    size_t g = digits_at(t, j, 19);
    if (g == 0 || nd + g > 19) break;
    bool grouped = sep != 0 || (j + g < t.size() && (t[j + g] == ' ' || t[j + g] == '-') &&
                                j + g + 1 < t.size() && is_digit(t[j + g + 1]));
    if (grouped && (g < 3 || g > 6)) break;
    std::copy(t.begin() + long(j), t.begin() + long(j + g), digits + nd);
    nd += g;
    j += g;
    if (nd >= 13 && luhn_ok(std::string_view(digits, nd)) && number_end(t, j)) best = j;
    if (j + 1 < t.size() && (t[j] == ' ' || t[j] == '-') && is_digit(t[j + 1]) &&
        (sep == 0 || sep == t[j])) {
      sep = t[j];
      ++j;
      continue;
    }
    break;
  }
  if (!best) return false;
  end = best;
  return true;
}

// ddd-dd-dddd (or with single spaces): area not 000, 666 or 9xx; group not 00;
// serial not 0000 (the SSA's never-issued numbers).
bool match_ssn(std::string_view t, size_t i, size_t& end) {
  if (i + 11 > t.size() || digits_at(t, i, 3) != 3) return false;
  char sep = t[i + 3];
  if ((sep != '-' && sep != ' ') || digits_at(t, i + 4, 2) != 2 || t[i + 6] != sep ||
      digits_at(t, i + 7, 4) != 4)
    return false;
  std::string_view area = t.substr(i, 3), group = t.substr(i + 4, 2), serial = t.substr(i + 7, 4);
  if (area == "000" || area == "666" || area[0] == '9' || group == "00" || serial == "0000")
    return false;
  if (!number_end(t, i + 11)) return false;
  end = i + 11;
  return true;
}

inline bool is_phone_sep(char c) {
  return c == '-' || c == '.' || c == ' ';
}

// North American: [+1 or 1, separator] (NPA) or NPA, then NXX and XXXX, with
// NPA and NXX starting 2-9 and separators between the groups: 555-123-4567,
// (555) 123-4567, +1 555.123.4567, 1-800-555-0199. Ten plain digits are not
// matched (too many ordinary numbers look like that).
bool match_na_phone(std::string_view t, size_t i, size_t& end) {
  size_t j = i;
  if (t[j] == '+') {
    if (j + 2 >= t.size() || t[j + 1] != '1') return false;
    j += 2;
    if (is_phone_sep(t[j])) ++j;
  } else if (t[j] == '1' && j + 1 < t.size() && is_phone_sep(t[j + 1])) {
    j += 2;
  }
  if (j >= t.size()) return false;
  bool paren = t[j] == '(';
  if (paren) ++j;
  if (digits_at(t, j, 3) != 3 || t[j] < '2') return false;
  j += 3;
  if (paren) {
    if (j >= t.size() || t[j] != ')') return false;
    ++j;
    if (j < t.size() && (t[j] == ' ' || t[j] == '-')) ++j;
  } else {
    if (j >= t.size() || !is_phone_sep(t[j])) return false;
    ++j;
  }
  if (digits_at(t, j, 3) != 3 || t[j] < '2') return false;
  j += 3;
  if (j >= t.size() || !is_phone_sep(t[j])) return false;
  ++j;
  if (digits_at(t, j, 4) != 4) return false;
  j += 4;
  if (!number_end(t, j)) return false;
  end = j;
  return true;
}

// International: '+', then digit groups (the first holds the country code;
// later ones may be parenthesised, as in "(0)") split by single spaces, dashes
// or dots; 8 to 15 digits in all (E.164 allows 15), not starting with 0.
bool match_intl_phone(std::string_view t, size_t i, size_t& end) {
  size_t j = i + 1;
  if (t[i] != '+' || j >= t.size() || !is_digit(t[j]) || t[j] == '0') return false;
  size_t total = 0;
  for (bool first = true;; first = false) {
    size_t k = j;
    if (!first && k < t.size() && is_phone_sep(t[k])) ++k;
    bool paren = !first && k < t.size() && t[k] == '(';
    if (paren) ++k;
    size_t g = digits_at(t, k, 15);
    if (g == 0) break;
    k += g;
    if (paren) {
      if (k >= t.size() || t[k] != ')' || g > 4) break;
      ++k;
    }
    total += g;
    if (total > 15) return false;
    j = k;
  }
  if (total < 8 || !number_end(t, j)) return false;
  end = j;
  return true;
}

// National numbers written without a '+': the trunk prefix and digit groups
// of each country's usual format, nothing looser (a leading 0 or 8, a group
// in parentheses, fixed group lengths), so that dates, prices, ISBNs and
// version numbers stay out.
//   UK  020 7946 0958, 0161 496 0123, 07700 900123, (020) 7946 0958: 11 digits
//   DE  030 12345678, 030/1234567, 0171 1234567, (089) 1234567: an area code
//       of 3 to 5 digits (0 first), 5 to 8 more
//   FR  01 23 45 67 89, 06.12.34.56.78: five pairs, 0 first
//   JP  03-1234-5678, 090-1234-5678: 10 or 11 digits in three dashed groups
//   BR  (11) 91234-5678, (21) 2345-6789
//   RU  8 (495) 123-45-67, 8 912 345 67 89, (495) 123-45-67
struct DigitGroup {
  size_t begin = 0, len = 0;  // the digits
  bool paren = false;
  char sep = 0;  // the separator before it: ' ', '-', '.', '/' (0 for none)
};

// Reads up to 6 groups of 1 to 8 digits from i: the first two may be in
// parentheses, each later one follows one separator (after a ')' the space
// may be missing). Bounded: at most 6 x 11 bytes.
size_t read_groups(std::string_view t, size_t i, DigitGroup* g) {
  size_t n = 0, j = i;
  while (n < 6) {
    DigitGroup d;
    size_t k = j;
    if (n > 0) {
      char c = k < t.size() ? t[k] : 0;
      if (c == ' ' || c == '-' || c == '.' || c == '/') {
        d.sep = c;
        ++k;
      } else if (!g[n - 1].paren) {
        break;
      }
    }
    if (n < 2 && k < t.size() && t[k] == '(') {
      d.paren = true;
      ++k;
    }
    size_t len = digits_at(t, k, 8);
    if (len == 0 || len > 8) break;
    d.begin = k;
    d.len = len;
    k += len;
    if (d.paren) {
      if (k >= t.size() || t[k] != ')') break;
      ++k;
    }
    g[n++] = d;
    j = k;
  }
  return n;
}

// The end of group `g` (past its ')').
inline size_t group_end(const DigitGroup& g) {
  return g.begin + g.len + (g.paren ? 1 : 0);
}

inline bool seps_in(const DigitGroup* g, size_t from, size_t n, std::string_view allowed) {
  for (size_t k = from; k < n; ++k)
    if (allowed.find(g[k].sep) == std::string_view::npos) return false;
  return true;
}

// Whether groups g[0..n) are one of the formats above.
bool national_format(std::string_view t, const DigitGroup* g, size_t n) {
  auto len = [&](size_t k) { return g[k].len; };
  auto digit = [&](size_t k, size_t at) { return t[g[k].begin + at]; };
  // A trunk prefix 0 and a non-zero digit after it: 0N...
  auto trunk = [&](size_t k) { return digit(k, 0) == '0' && len(k) >= 2 && digit(k, 1) != '0'; };
  size_t total = 0;
  for (size_t k = 0; k < n; ++k) total += len(k);
  for (size_t k = 1; k < n; ++k)
    if (g[k].paren) {
      // Only RU's "8 (495) ...": the code after a lone 8.
      if (k != 1 || len(0) != 1 || digit(0, 0) != '8') return false;
    }
  // After a ')' comes a space or nothing; elsewhere one separator.
  for (size_t k = 1; k < n; ++k)
    if (g[k - 1].paren ? (g[k].sep != ' ' && g[k].sep != 0) : g[k].sep == 0) return false;
  bool first_paren = g[0].paren;
  // FR: 0N ## ## ## ##, one separator throughout.
  if (n == 5 && !first_paren && trunk(0) && len(0) == 2 && len(1) == 2 && len(2) == 2 &&
      len(3) == 2 && len(4) == 2 && seps_in(g, 1, n, std::string_view(&g[1].sep, 1)) &&
      g[1].sep != '/')
    return true;
  // JP: 0N..-####-####, 10 or 11 digits, dashes.
  if (n == 3 && !first_paren && trunk(0) && len(0) <= 5 && len(1) <= 4 && len(2) == 4 &&
      (total == 10 || total == 11) && seps_in(g, 1, n, "-"))
    return true;
  // UK: 11 digits, 0N first: 3+4+4, 4+3+4, 5+6, 5+3+3; spaces or dashes.
  if (trunk(0) && total == 11 && seps_in(g, 1, n, " -") &&
      ((n == 3 && ((len(0) == 3 && len(1) == 4) || (len(0) == 4 && len(1) == 3) ||
                   (len(0) == 5 && len(1) == 3))) ||
       (n == 2 && len(0) == 5)))
    return true;
  // DE: area code 0N. (3 to 5 digits), then 5 to 8 digits; space, '/' or '-'.
  if (n == 2 && trunk(0) && len(0) >= 3 && len(0) <= 5 && len(1) >= 5 && len(1) <= 8 &&
      (first_paren || seps_in(g, 1, n, " /-")))
    return true;
  // BR: (NN) ####-#### or (NN) 9####-####.
  if (n == 3 && first_paren && len(0) == 2 && digit(0, 0) != '0' && digit(0, 1) != '0' &&
      (len(1) == 4 || (len(1) == 5 && digit(1, 0) == '9')) && len(2) == 4 && g[2].sep == '-')
    return true;
  // RU: [8] (N##) ###-##-## or 8 N## ### ## ##; spaces or dashes.
  size_t r = n == 5 && len(0) == 1 && digit(0, 0) == '8' && !first_paren ? 1 : 0;
  if (n - r == 4 && len(r) == 3 && digit(r, 0) != '0' && len(r + 1) == 3 && len(r + 2) == 2 &&
      len(r + 3) == 2 && seps_in(g, r + 2, n, r == 0 ? "-" : " -") && (r == 1 || first_paren) &&
      (g[r].paren || r == 1))
    return true;
  return false;
}

// The longest prefix of the groups at i that is a national number and ends
// where a number may end.
bool match_national_phone(std::string_view t, size_t i, size_t& end) {
  char c = t[i];
  if (c != '0' && c != '8' && c != '(') return false;
  DigitGroup g[6];
  size_t n = read_groups(t, i, g);
  for (size_t k = n; k >= 2; --k) {
    size_t e = group_end(g[k - 1]);
    if (number_end(t, e) && national_format(t, g, k)) {
      end = e;
      return true;
    }
  }
  return false;
}

// Four dotted decimal octets, each 0..255 without leading zeros.
bool match_ipv4(std::string_view t, size_t i, size_t& end) {
  size_t j = i;
  for (int part = 0; part < 4; ++part) {
    if (part > 0) {
      if (j >= t.size() || t[j] != '.') return false;
      ++j;
    }
    size_t n = digits_at(t, j, 3);
    if (n == 0 || n > 3 || (n > 1 && t[j] == '0')) return false;
    int v = 0;
    for (size_t k = 0; k < n; ++k) v = v * 10 + (t[j + k] - '0');
    if (v > 255) return false;
    j += n;
  }
  if (!number_end(t, j)) return false;
  end = j;
  return true;
}

// A section number, not an address: after a word that names one ("section
// 6.2.4.1", "§ 6.2.4.1", "version 1.2.3.4"), or opening a line (after
// indentation or Markdown's '#', '>', '*') with parts 1 to 99 and followed by
// '.', ')' or a capitalised title ("6.2.4.1. The configuration"); an address
// has a 0 or a part over 99 far more often (10.0.0.1, 192.168.1.1). Elsewhere
// it stays an address: "see 10.0.0.1." at a sentence's end, "10.1.2.3 gw".
// Debian Reference's text has 6 such headings, Python's reST sources a
// "section 6.4.4.2", 46 MB of Debian changelogs and the fortunes 25 versions
// ("Standards-Version 3.9.6.0") and sections; none of them lost an address.
bool is_section_number(std::string_view t, size_t i, size_t end) {
  // The word before: up to 12 letters (and a '.'), then spaces.
  size_t k = i;
  while (k > 0 && i - k < 3 && (t[k - 1] == ' ' || t[k - 1] == '\t')) --k;
  size_t word_end = k;
  if (word_end < i) {
    if (k > 0 && t[k - 1] == '.') --k;
    while (k > 0 && word_end - k < 13 && is_alpha(t[k - 1])) --k;
    std::string word;
    for (size_t j = k; j < word_end; ++j) word.push_back(char(t[j] | 0x20));
    static constexpr std::string_view kWords[] = {
        "section", "sections",  "sec.",    "chapter",  "ch.",   "clause", "article",
        "art.",    "paragraph", "para.",   "appendix", "annex", "figure", "fig.",
        "table",   "step",      "version", "release",  "rule",  "part"};
    if (k == 0 || !is_wordish(t[k - 1]))
      for (std::string_view w : kWords)
        if (word == w) return true;
  }
  if (word_end >= 2 && t[word_end - 2] == '\xC2' && t[word_end - 1] == '\xA7')
    return true;  // "§ 6.2.4.1" ("§6.2.4.1" never starts a number)
  // Opening a line.
  k = i;
  while (k > 0 && i - k < 16 &&
         (t[k - 1] == ' ' || t[k - 1] == '\t' || t[k - 1] == '#' || t[k - 1] == '>' ||
          t[k - 1] == '*'))
    --k;
  if (k > 0 && t[k - 1] != '\n') return false;
  for (size_t j = i; j < end;) {
    size_t n = digits_at(t, j, 3);
    if (t[j] == '0' || n > 2) return false;
    j += n + 1;
  }
  if (end == t.size()) return false;
  char c = t[end];
  if (c == '.' || c == ')') return true;
  if (c != ' ' && c != '\t') return false;
  size_t j = end;
  while (j < t.size() && j - end < 4 && (t[j] == ' ' || t[j] == '\t')) ++j;
  // A title: an upper-case letter, or a letter of another script.
  return j < t.size() && ((t[j] >= 'A' && t[j] <= 'Z') || static_cast<unsigned char>(t[j]) >= 0xC0);
}

void scan_numbers(std::string_view t, uint32_t mask, std::vector<PiiMatch>& out) {
  auto on = [&](PiiType p) { return (mask >> unsigned(p)) & 1u; };
  size_t i = 0;
  // After a '(' that opened no match, one may start at the digit inside it
  // ("(020 7946 0958)"), but not an IPv4 address: there its look-alikes, a
  // version after a name ("dpkg (1.16.4.3)", every changelog entry), are far
  // more common than addresses.
  size_t after_paren = std::string_view::npos;
  while (i < t.size()) {
    char c = t[i];
    if (!(is_digit(c) || c == '+' || c == '(') || !number_boundary(t, i)) {
      ++i;
      continue;
    }
    size_t end = 0;
    if (is_digit(c) && on(PiiType::CreditCard) && match_credit_card(t, i, end)) {
      out.push_back({i, end, PiiType::CreditCard});
    } else if (is_digit(c) && on(PiiType::Ssn) && match_ssn(t, i, end)) {
      out.push_back({i, end, PiiType::Ssn});
    } else if (on(PiiType::Phone) && (match_na_phone(t, i, end) || match_intl_phone(t, i, end) ||
                                      match_national_phone(t, i, end))) {
      out.push_back({i, end, PiiType::Phone});
    } else if (is_digit(c) && i != after_paren && on(PiiType::IpAddress) && match_ipv4(t, i, end) &&
               !is_section_number(t, i, end)) {
      out.push_back({i, end, PiiType::IpAddress});
    } else if (c == '(') {
      after_paren = ++i;
      continue;
    } else {
      // Skip the rest of this number: no match can start inside it.
      ++i;
      while (i < t.size() && (is_digit(t[i]) || is_alpha(t[i]))) ++i;
      continue;
    }
    i = end;
  }
}

// ---- IPv6 -------------------------------------------------------------------------

inline bool is_ipv6_char(char c) {
  return is_hex(c) || c == ':' || c == '.';
}

// RFC 4291 text forms: eight groups of 1-4 hex digits, or fewer around one
// "::", the last two groups optionally a dotted IPv4 address. To keep words
// and C++ names such as "A::B" out, a compressed form needs a decimal digit
// and two explicit groups (or to start with "::", as in "::1"); to keep
// proportions such as "24:16::12:9" (common in older prose) out, it also needs
// a group that is not a one- or two-digit decimal number.
bool valid_ipv6(std::string_view s) {
  size_t dc = s.find("::");
  if (dc != std::string_view::npos && s.find("::", dc + 1) != std::string_view::npos) return false;
  if (s.find(":::") != std::string_view::npos) return false;
  if (s.front() == ':' && !s.starts_with("::")) return false;
  if (s.back() == ':' && !s.ends_with("::")) return false;
  size_t groups = 0;
  bool digit = false, only_small_numbers = true;
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == ':') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && s[j] != ':') ++j;
    std::string_view g = s.substr(i, j - i);
    if (g.find('.') != std::string_view::npos) {  // an IPv4 tail, last
      size_t e = 0;
      if (j != s.size() || !match_ipv4(g, 0, e) || e != g.size()) return false;
      groups += 2;
      digit = true;
      only_small_numbers = false;
    } else {
      if (g.size() > 4) return false;
      for (char c : g) {
        digit |= is_digit(c);
        only_small_numbers &= is_digit(c);
      }
      only_small_numbers &= g.size() <= 2;
      ++groups;
    }
    i = j;
  }
  if (dc == std::string_view::npos) return groups == 8;
  if (groups > 7 || !digit) return false;
  if (s.starts_with("::")) return true;
  return groups >= 2 && !only_small_numbers;
}

void scan_ipv6(std::string_view t, std::vector<PiiMatch>& out) {
  size_t i = 0;
  while (i < t.size()) {
    if (!is_ipv6_char(t[i]) || t[i] == '.' ||
        (i > 0 && (is_wordish(t[i - 1]) || t[i - 1] == ':' || t[i - 1] == '.'))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < t.size() && is_ipv6_char(t[j])) ++j;
    size_t e = j;
    while (e > i && t[e - 1] == '.') --e;  // a full stop after the address
    std::string_view tok = t.substr(i, e - i);
    if (tok.find(':') != std::string_view::npos && (j >= t.size() || !is_wordish(t[j])) &&
        valid_ipv6(tok))
      out.push_back({i, e, PiiType::IpAddress});
    i = j;
  }
}

constexpr std::array<std::string_view, kPiiTypes> kNames = {
    "url_with_credentials", "email", "credit_card", "ssn", "phone", "ip_address"};
constexpr std::array<std::string_view, kPiiTypes> kPlaceholders = {
    "<URL_WITH_CREDENTIALS>", "<EMAIL>", "<CREDIT_CARD>", "<SSN>", "<PHONE>", "<IP_ADDRESS>"};

}  // namespace

std::string_view pii_name(PiiType t) {
  return kNames[size_t(t)];
}
std::string_view pii_placeholder(PiiType t) {
  return kPlaceholders[size_t(t)];
}

bool pii_type_of(std::string_view name, PiiType& out) {
  for (size_t i = 0; i < kPiiTypes; ++i)
    if (kNames[i] == name) {
      out = PiiType(i);
      return true;
    }
  return false;
}

std::vector<PiiMatch> find_pii(std::string_view t, uint32_t mask) {
  std::vector<PiiMatch> all;
  auto on = [&](PiiType p) { return (mask >> unsigned(p)) & 1u; };
  if (on(PiiType::UrlWithCredentials) && t.find("://") != std::string_view::npos)
    scan_url_credentials(t, all);
  if (on(PiiType::Email) && t.find('@') != std::string_view::npos) scan_emails(t, all);
  scan_numbers(t, mask, all);
  if (on(PiiType::IpAddress) && t.find(':') != std::string_view::npos) scan_ipv6(t, all);
  std::sort(all.begin(), all.end(), [](const PiiMatch& a, const PiiMatch& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.type < b.type;
  });
  std::vector<PiiMatch> kept;
  for (const PiiMatch& m : all)
    if (kept.empty() || m.begin >= kept.back().end) kept.push_back(m);
  return kept;
}

std::string redact_pii(std::string_view t, uint32_t mask, std::array<int64_t, kPiiTypes>* counts) {
  std::vector<PiiMatch> ms = find_pii(t, mask);
  std::string out;
  out.reserve(t.size());
  size_t at = 0;
  for (const PiiMatch& m : ms) {
    out.append(t.substr(at, m.begin - at));
    out.append(pii_placeholder(m.type));
    at = m.end;
    if (counts) ++(*counts)[size_t(m.type)];
  }
  out.append(t.substr(at));
  return out;
}

namespace {

class PiiStage final : public DocStage {
 public:
  explicit PiiStage(StageConfig& c) {
    std::vector<std::string> types;
    for (std::string_view n : kNames) types.emplace_back(n);
    c.bind("types", types, "the kinds of PII to redact");
    mask_ = 0;
    for (const std::string& name : types) {
      PiiType t;
      if (!pii_type_of(name, t)) {
        std::string known;
        for (std::string_view n : kNames) known += (known.empty() ? "" : ", ") + std::string(n);
        c.fail_key("types", fmt::format("unknown PII type '{}' (known: {})", name, known));
      }
      mask_ |= 1u << unsigned(t);
    }
    if (mask_ == 0) c.fail_key("types", "must name at least one type");
  }

  Verdict apply(Document& doc, Counters& counts) const override {
    std::array<int64_t, kPiiTypes> n{};
    std::string red = redact_pii(doc.text, mask_, &n);
    bool any = false;
    for (size_t i = 0; i < kPiiTypes; ++i)
      if (n[i]) {
        counts["redacted_" + std::string(kNames[i])] += n[i];
        any = true;
      }
    if (any) doc.text = std::move(red);
    return Verdict::kept();
  }

 private:
  uint32_t mask_ = kAllPii;
};

}  // namespace

void register_pii_stages(StageRegistry& r) {
  r.add({"pii",
         "replace e-mails, phone numbers, SSNs, credit cards, IP addresses and URLs with "
         "credentials by <EMAIL>, <PHONE>, ... (types: to choose)",
         [](StageConfig& c) -> std::unique_ptr<DocStage> { return std::make_unique<PiiStage>(c); },
         nullptr});
}

}  // namespace nk::curate
