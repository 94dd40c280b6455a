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

inline bool is_local_char(char c) {
  return is_alnum(c) || c == '.' || c == '_' || c == '%' || c == '+' || c == '-';
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
    while (s < a && t[s] == '.') ++s;
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

void scan_numbers(std::string_view t, uint32_t mask, std::vector<PiiMatch>& out) {
  auto on = [&](PiiType p) { return (mask >> unsigned(p)) & 1u; };
  size_t i = 0;
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
    } else if (on(PiiType::Phone) && (match_na_phone(t, i, end) || match_intl_phone(t, i, end))) {
      out.push_back({i, end, PiiType::Phone});
    } else if (is_digit(c) && on(PiiType::IpAddress) && match_ipv4(t, i, end)) {
      out.push_back({i, end, PiiType::IpAddress});
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
