#include "align/rewards/answer_match.h"

#include <unicode/unistr.h>

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace nk {

namespace {

// A number: "1,234.5", "72", ".5", "3/4" (a leading sign or '$' before it).
constexpr const char* kNumber =
    R"((-?\$?\s*(?:[0-9][0-9,]*(?:\.[0-9]+)?|\.[0-9]+)(?:/[0-9]+(?![0-9/]|\.[0-9]))?))";
// GSM8K's answer line: "#### 72", "#### $1,200", "####-3".
constexpr const char* kGsm8k = R"(####\s*\$?\s*(-?[0-9.,]*[0-9]))";

std::string_view trim(std::string_view s) {
  const auto sp = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!s.empty() && sp(s.front())) s.remove_prefix(1);
  while (!s.empty() && sp(s.back())) s.remove_suffix(1);
  return s;
}

std::string fold(const std::string& s) {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
  u.foldCase();
  std::string out;
  u.toUTF8String(out);
  return out;
}

// A plain decimal: digits with at most one '.', at least one digit, an
// optional leading '-'.
std::optional<double> decimal(std::string_view s) {
  if (s.empty()) return std::nullopt;
  size_t i = s[0] == '-' ? 1 : 0, digits = 0, dots = 0;
  for (size_t j = i; j < s.size(); ++j) {
    if (std::isdigit(static_cast<unsigned char>(s[j])))
      ++digits;
    else if (s[j] == '.')
      ++dots;
    else
      return std::nullopt;
  }
  if (digits == 0 || dots > 1) return std::nullopt;
  return std::strtod(std::string(s).c_str(), nullptr);
}

size_t find_ascii_nocase(std::string_view hay, std::string_view needle, size_t from) {
  if (needle.empty() || hay.size() < needle.size()) return std::string_view::npos;
  for (size_t i = from; i + needle.size() <= hay.size(); ++i) {
    size_t k = 0;
    while (k < needle.size() && std::tolower(static_cast<unsigned char>(hay[i + k])) ==
                                    std::tolower(static_cast<unsigned char>(needle[k])))
      ++k;
    if (k == needle.size()) return i;
  }
  return std::string_view::npos;
}

}  // namespace

void AccuracyRewardOptions::check() const {
  if (answer_key.empty()) fail("align.reward_accuracy.answer_key: empty; the record's field name");
  if (extract != "gsm8k" && extract != "boxed" && extract != "marker" && extract != "last_number" &&
      extract != "regex")
    fail(
        "align.reward_accuracy.extract: '{}' is none of gsm8k, boxed, marker, last_number, "
        "regex",
        extract);
  if (extract == "regex") {
    if (pattern.empty())
      fail("align.reward_accuracy.pattern: empty; extract=regex needs a pattern");
    RewardRegex("align.reward_accuracy.pattern", pattern);  // compiles
  }
  if (extract == "marker" && trim(marker).empty())
    fail("align.reward_accuracy.marker: empty; extract=marker needs the text before answers");
  if (reference != "extract" && reference != "as_is")
    fail("align.reward_accuracy.reference: '{}' is neither extract nor as_is", reference);
  if (compare != "number" && compare != "exact")
    fail("align.reward_accuracy.compare: '{}' is neither number nor exact", compare);
  if (!(tolerance >= 0) || !std::isfinite(tolerance))
    fail("align.reward_accuracy.tolerance: must be a finite number >= 0, got {}", tolerance);
}

std::optional<double> parse_answer_number(std::string_view s) {
  std::string t;
  for (char c : trim(s))
    if (c != ',' && c != '$' && !std::isspace(static_cast<unsigned char>(c))) t += c;
  if (!t.empty() && t[0] == '+') t.erase(0, 1);
  if (t.size() > 1 && (t.back() == '.' || t.back() == '%')) t.pop_back();
  if (const size_t slash = t.find('/'); slash != std::string::npos) {
    const auto a = decimal(std::string_view(t).substr(0, slash));
    const auto b = decimal(std::string_view(t).substr(slash + 1));
    if (!a || !b || *b == 0) return std::nullopt;
    return *a / *b;
  }
  return decimal(t);
}

std::optional<std::string> last_boxed(std::string_view s) {
  size_t at = std::string_view::npos;
  size_t open = 0;
  for (std::string_view tag : {"\\boxed{", "\\fbox{"}) {
    const size_t p = s.rfind(tag);
    if (p != std::string_view::npos && (at == std::string_view::npos || p > at)) {
      at = p;
      open = p + tag.size();
    }
  }
  if (at == std::string_view::npos) return std::nullopt;
  int depth = 1;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '{') ++depth;
    if (s[i] == '}' && --depth == 0) return std::string(trim(s.substr(open, i - open)));
  }
  return std::nullopt;
}

AnswerMatcher::AnswerMatcher(const AccuracyRewardOptions& opt) : opt_(opt) {
  opt_.check();
  if (opt_.extract == "gsm8k")
    rule_ = std::make_unique<RewardRegex>("align.reward_accuracy.extract", kGsm8k);
  else if (opt_.extract == "last_number")
    rule_ = std::make_unique<RewardRegex>("align.reward_accuracy.extract", kNumber);
  else if (opt_.extract == "regex")
    rule_ = std::make_unique<RewardRegex>("align.reward_accuracy.pattern", opt_.pattern);
  number_ = std::make_unique<RewardRegex>("align.reward_accuracy.compare", kNumber);
}

AnswerMatcher::~AnswerMatcher() = default;

std::optional<std::string> AnswerMatcher::marker_answer(std::string_view text) const {
  const std::string_view m = trim(opt_.marker);
  size_t at = std::string_view::npos;
  for (size_t p = find_ascii_nocase(text, m, 0); p != std::string_view::npos;
       p = find_ascii_nocase(text, m, p + 1))
    at = p;
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = text.substr(at + m.size());
  rest = rest.substr(0, rest.find('\n'));
  rest = trim(rest);
  if (!rest.empty() && rest.front() == ':') rest = trim(rest.substr(1));
  while (!rest.empty() && rest.back() == '.') rest = trim(rest.substr(0, rest.size() - 1));
  if (rest.empty()) return std::nullopt;
  return std::string(rest);
}

std::optional<std::string> AnswerMatcher::extract(std::string_view text) const {
  std::optional<std::string> a;
  if (opt_.extract == "boxed")
    a = last_boxed(text);
  else if (opt_.extract == "marker")
    a = marker_answer(text);
  else if (opt_.extract == "last_number")
    a = rule_->last(text);
  else
    a = rule_->first(text);
  if (a) a = std::string(trim(*a));
  return a;
}

std::string AnswerMatcher::reference(std::string_view text) const {
  if (opt_.reference == "extract")
    if (std::optional<std::string> a = extract(text)) return *a;
  return std::string(trim(text));
}

std::optional<double> AnswerMatcher::number_in(const std::string& s) const {
  if (std::optional<double> v = parse_answer_number(s)) return v;
  if (std::optional<std::string> first = number_->first(s)) return parse_answer_number(*first);
  return std::nullopt;
}

bool AnswerMatcher::same(const std::string& answer, const std::string& reference) const {
  if (opt_.compare == "exact") {
    const std::string a(trim(answer)), r(trim(reference));
    return opt_.ignore_case ? fold(a) == fold(r) : a == r;
  }
  const std::optional<double> r = number_in(reference);
  if (!r)
    fail(
        "the reference answer '{}' holds no number (align.reward_accuracy.compare=number; "
        "compare=exact compares text)",
        reference);
  const std::optional<double> a = number_in(answer);
  return a && std::fabs(*a - *r) <= opt_.tolerance;
}

double AnswerMatcher::score(std::string_view completion, std::string_view reference_text) const {
  const std::string ref = reference(reference_text);
  const std::optional<std::string> a = extract(completion);
  return a && same(*a, ref) ? 1.0 : 0.0;
}

}  // namespace nk
