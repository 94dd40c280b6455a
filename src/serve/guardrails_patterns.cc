#include "serve/guardrails_patterns.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>
#include <unicode/uchar.h>

#include <cctype>

#include "curate/words.h"
#include "serve/guardrails_config.h"

namespace nk {

namespace {

// Bounds on one match attempt: far above what a sane pattern needs on a
// prompt, far below a runaway backtrack's seconds.
constexpr uint32_t kMatchLimit = 1'000'000;
constexpr uint32_t kDepthLimit = 10'000;

// Per-thread match state (as the pre-tokenizer keeps it): one ovector pair
// (whole matches only), the limits, a JIT stack for deep patterns.
struct MatchState {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* mc = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* js = pcre2_jit_stack_create(32 << 10, 1 << 20, nullptr);
  MatchState() {
    pcre2_set_match_limit(mc, kMatchLimit);
    pcre2_set_depth_limit(mc, kDepthLimit);
    pcre2_jit_stack_assign(mc, nullptr, js);
  }
  ~MatchState() {
    pcre2_jit_stack_free(js);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
  }
};

MatchState& match_state() {
  thread_local MatchState s;
  return s;
}

bool is_word_edge(char32_t cp) {
  if (curate::is_unspaced_script(cp)) return false;
  return cp == '_' || u_isalnum(UChar32(cp)) || (U_GET_GC_MASK(UChar32(cp)) & U_GC_M_MASK) != 0;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

}  // namespace

struct PatternList::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

PatternList::PatternList() = default;
PatternList::~PatternList() = default;
PatternList::PatternList(PatternList&&) noexcept = default;
PatternList& PatternList::operator=(PatternList&&) noexcept = default;

std::string keyword_pattern(std::string_view word) {
  size_t b = 0, e = word.size();
  while (b < e && is_space(word[b])) ++b;
  while (e > b && is_space(word[e - 1])) --e;
  word = word.substr(b, e - b);
  std::string body;
  for (size_t i = 0; i < word.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(word[i]);
    if (is_space(char(c))) {
      while (i + 1 < word.size() && is_space(word[i + 1])) ++i;
      body += "\\s+";
    } else if (c == 0) {
      body += "\\x{0}";
    } else if (c < 0x80 && !std::isalnum(c)) {
      body += '\\';  // any ASCII punctuation escaped is itself
      body += char(c);
    } else {
      body += char(c);
    }
  }
  if (word.empty()) return body;
  size_t at = 0;
  const char32_t first = curate::next_code_point(word, at);
  size_t last_at = word.size() - 1;
  while (last_at > 0 && (static_cast<unsigned char>(word[last_at]) & 0xC0) == 0x80) --last_at;
  const char32_t last = curate::next_code_point(word, last_at);
  constexpr std::string_view kWordChar = "[\\p{L}\\p{M}\\p{N}_]";
  std::string p;
  if (is_word_edge(first)) p += fmt::format("(?<!{})", kWordChar);
  p += body;
  if (is_word_edge(last)) p += fmt::format("(?!{})", kWordChar);
  return p;
}

std::unique_ptr<PatternList::Code> PatternList::compile(size_t index, std::string_view shown,
                                                        const std::string& pattern,
                                                        uint32_t options) {
  int err = 0;
  PCRE2_SIZE off = 0;
  auto c = std::make_unique<PatternList::Code>();
  c->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    options | PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
  if (!c->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw PatternError(index, fmt::format("'{}' does not compile: {} (at offset {})", shown,
                                          reinterpret_cast<const char*>(msg), off));
  }
  pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE);  // the interpreter serves where JIT cannot
  MatchState& s = match_state();
  if (pcre2_match(c->code, reinterpret_cast<PCRE2_SPTR>(""), 0, 0, 0, s.md, s.mc) >= 0)
    throw PatternError(index, fmt::format("'{}' matches the empty string", shown));
  return c;
}

PatternList PatternList::keywords(const std::vector<std::string>& words) {
  PatternList l;
  for (size_t i = 0; i < words.size(); ++i)
    l.codes_.push_back(compile(i, words[i], keyword_pattern(words[i]), PCRE2_CASELESS));
  return l;
}

PatternList PatternList::regexes(const std::vector<std::string>& patterns) {
  PatternList l;
  for (size_t i = 0; i < patterns.size(); ++i)
    l.codes_.push_back(compile(i, patterns[i], patterns[i], 0));
  return l;
}

PatternList compile_rail_patterns(const GuardrailsConfig& c, const std::string& key,
                                  const std::vector<std::string>& items, bool keywords) {
  try {
    return keywords ? PatternList::keywords(items) : PatternList::regexes(items);
  } catch (const PatternError& e) {
    c.fail_at(key, e.what(), int64_t(e.index));
  }
}

bool PatternList::find_all(std::string_view text, size_t from, std::vector<TextSpan>& out) const {
  MatchState& s = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  bool ok = true;
  for (size_t i = 0; i < codes_.size(); ++i) {
    for (size_t start = from; start <= text.size();) {
      const int rc = pcre2_match(codes_[i]->code, subject, text.size(), start, 0, s.md, s.mc);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {  // a limit (or an internal error): counted as a match by the rails
        ok = false;
        break;
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.md);
      if (ov[1] > ov[0]) {
        out.push_back({size_t(ov[0]), size_t(ov[1]), int64_t(i)});
        start = ov[1];
      } else {  // an empty match (a lookaround): on to the next character
        start = ov[1] + 1;
        while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
          ++start;
      }
    }
  }
  return ok;
}

}  // namespace nk
