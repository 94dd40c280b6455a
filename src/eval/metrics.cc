#include "eval/metrics.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/locid.h>
#include <unicode/unistr.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "core/error.h"
#include "eval/py_random.h"
#include "eval/py_text.h"

namespace nk {

namespace {

struct Regex {
  pcre2_code* code = nullptr;
  pcre2_match_data* md = nullptr;
  explicit Regex(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("regular expression '{}': {} at offset {}", pattern, reinterpret_cast<char*>(msg), off);
    }
    md = pcre2_match_data_create_from_pattern(code, nullptr);
  }
  ~Regex() {
    pcre2_match_data_free(md);
    pcre2_code_free(code);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  uint32_t groups() const {
    uint32_t n = 0;
    pcre2_pattern_info(code, PCRE2_INFO_CAPTURECOUNT, &n);
    return n;
  }
  // Each match's [start, end) of group 0..groups (PCRE2_UNSET when unmatched),
  // advancing past empty matches as Python does.
  template <class Fn>
  void each(const std::string& text, Fn&& fn) {
    size_t at = 0;
    const auto* subj = reinterpret_cast<PCRE2_SPTR>(text.data());
    while (at <= text.size()) {
      const int rc = pcre2_match(code, subj, text.size(), at, 0, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) fail("regular expression: matching failed (PCRE2 error {})", rc);
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      fn(ov);
      if (ov[1] > ov[0]) {
        at = ov[1];
      } else {  // an empty match: step over one character
        at = ov[1] + 1;
        while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
      }
    }
  }
};

std::string icu_case(const std::string& s, bool lower) {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
  if (lower)
    u.toLower(icu::Locale::getRoot());
  else
    u.toUpper(icu::Locale::getRoot());
  std::string out;
  u.toUTF8String(out);
  return out;
}

std::string remove_chars(const std::string& s, const char* chars) {
  std::string out;
  for (char ch : s)
    if (!std::strchr(chars, ch) || ch == '\0') out += ch;
  return out;
}

}  // namespace

std::vector<std::vector<std::string>> regex_findall(const std::string& pattern,
                                                    const std::string& text) {
  Regex re(pattern);
  const uint32_t g = re.groups();
  std::vector<std::vector<std::string>> out;
  re.each(text, [&](const PCRE2_SIZE* ov) {
    std::vector<std::string> m;
    for (uint32_t k = g == 0 ? 0 : 1; k <= g; ++k)
      m.push_back(ov[2 * k] == PCRE2_UNSET ? std::string()
                                           : text.substr(ov[2 * k], ov[2 * k + 1] - ov[2 * k]));
    out.push_back(std::move(m));
  });
  return out;
}

std::string regex_remove(const std::string& pattern, const std::string& text) {
  Regex re(pattern);
  std::string out;
  size_t kept = 0;
  re.each(text, [&](const PCRE2_SIZE* ov) {
    out.append(text, kept, ov[0] - kept);
    kept = ov[1];
  });
  out.append(text, kept, std::string::npos);
  return out;
}

double exact_match(std::string p, std::string r, const MetricSpec& m) {
  for (const std::string& re : m.regexes_to_ignore) {
    p = regex_remove(re, p);
    r = regex_remove(re, r);
  }
  if (m.ignore_case) p = icu_case(p, true), r = icu_case(r, true);
  static const char* kPunct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
  if (m.ignore_punctuation) p = remove_chars(p, kPunct), r = remove_chars(r, kPunct);
  if (m.ignore_numbers) p = remove_chars(p, "0123456789"), r = remove_chars(r, "0123456789");
  return p == r ? 1.0 : 0.0;
}

std::vector<std::string> apply_filter(const FilterSpec& f, std::vector<std::string> resps) {
  for (const FilterStep& s : f.steps) {
    if (s.function == "take_first") {
      if (resps.size() > 1) resps.resize(1);
      continue;
    }
    if (s.function == "take_first_k") {
      if (int64_t(resps.size()) < s.k)
        fail("filter take_first_k: k {} of {} answers (the harness asserts repeats >= k)", s.k,
             resps.size());
      resps.resize(size_t(s.k));
      continue;
    }
    if (s.function == "majority_vote") {  // Counter(resps).most_common(1): ties to the first seen
      std::map<std::string, int64_t> count;
      for (const std::string& r : resps) ++count[r];
      std::string vote;
      int64_t best = 0;
      for (const std::string& r : resps)
        if (count[r] > best) best = count[r], vote = r;
      resps.assign(1, vote);
      continue;
    }
    for (std::string& r : resps) {
      if (s.function == "lowercase" || s.function == "uppercase") {
        r = icu_case(r, s.function == "lowercase");
      } else if (s.function == "remove_whitespace") {
        r = py_strip(r);
      } else {  // regex
        const auto found = regex_findall(s.regex_pattern, r);
        if (found.empty()) {
          r = s.fallback;
          continue;
        }
        const int64_t n = int64_t(found.size());
        const int64_t k = s.group_select < 0 ? n + s.group_select : s.group_select;
        if (k < 0 || k >= n)
          fail("filter regex: group_select {} picks no match of {} (Python raises IndexError)",
               s.group_select, n);
        const std::vector<std::string>& m = found[size_t(k)];
        std::string pick = s.fallback;
        if (m.size() == 1) {
          pick = m[0];
        } else {
          for (const std::string& g : m)
            if (!g.empty()) {
              pick = g;
              break;
            }
        }
        r = py_strip(pick);
      }
    }
  }
  return resps;
}

double mean(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v;
  return s / double(x.size());
}

std::optional<double> mean_stderr(const std::vector<double>& x) {
  if (x.size() < 2) return std::nullopt;
  const double mu = mean(x);
  double ss = 0;
  for (double v : x) ss += (v - mu) * (v - mu);
  return std::sqrt(ss / double(x.size() - 1)) / std::sqrt(double(x.size()));
}

double perplexity(const std::vector<double>& ll) {
  return std::exp(-mean(ll));
}

std::optional<double> bootstrap_stderr(const std::function<double(const std::vector<double>&)>& f,
                                       const std::vector<double>& xs, int64_t iters) {
  const int64_t chunk = std::min<int64_t>(1000, iters), chunks = chunk > 0 ? iters / chunk : 0;
  std::vector<double> res(static_cast<size_t>(chunks * chunk));
  const size_t n = xs.size();
  // Chunks are independent streams: in parallel, each into its own place.
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < chunks; ++i) {
    PyRandom rnd(static_cast<uint64_t>(i));
    std::vector<double> draw(n);
    for (int64_t r = 0; r < chunk; ++r) {
      for (size_t k = 0; k < n; ++k) draw[k] = xs[size_t(std::floor(rnd.random() * double(n)))];
      res[size_t(i * chunk + r)] = f(draw);
    }
  }
  if (res.size() < 2) return std::nullopt;
  const double mu = mean(res);
  double ss = 0;
  for (double v : res) ss += (v - mu) * (v - mu);
  return std::sqrt(ss / double(res.size() - 1));
}

double weighted_perplexity(const std::vector<std::pair<double, double>>& items) {
  double a = 0, b = 0;
  for (const auto& [x, w] : items) a += x, b += w;
  return std::exp(-a / b);
}

double bits_per_byte(const std::vector<std::pair<double, double>>& items) {
  double a = 0, b = 0;
  for (const auto& [x, w] : items) a += x, b += w;
  return -a / b / std::log(2.0);
}

}  // namespace nk
