// The text patterns of the guardrails: blocked keywords (literal words or
// phrases) and blocked regular expressions, both compiled with PCRE2 (as the
// tokenizers' pre-tokenizer is), JIT-compiled when the platform allows.
//
// Keywords match case-insensitively (Unicode case folding) and as whole
// words: a keyword that starts or ends with a letter, mark, digit or '_' of
// a space-separated script matches only where the text's neighbouring
// character is none of those ("bomb" matches "a BOMB!" but not "bombastic");
// edges in Han, Kana, Thai and the other unspaced scripts need no boundary.
// Whitespace inside a keyword matches any run of whitespace.
//
// Regular expressions are PCRE2's, taken as written ((?i) for any case), in
// UTF mode with Unicode properties; one matching the empty string is refused.
//
// Matching is thread-safe and bounded: a match that would exceed PCRE2's
// match or depth limit (catastrophic backtracking) reports `limited`, which
// the rails count as a match (a guardrail fails closed).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace nk {

// A match: bytes [begin, end) of the text, found by pattern `index`.
struct TextSpan {
  size_t begin = 0, end = 0;
  int64_t index = 0;
};

// A pattern that does not compile; `index` is its item in the list.
class PatternError : public Error {
 public:
  PatternError(size_t index, const std::string& msg) : Error(msg), index(index) {}
  size_t index;
};

class PatternList {
 public:
  PatternList();
  ~PatternList();
  PatternList(PatternList&&) noexcept;
  PatternList& operator=(PatternList&&) noexcept;

  // PatternError for an entry that does not compile or matches "".
  static PatternList keywords(const std::vector<std::string>& words);
  static PatternList regexes(const std::vector<std::string>& patterns);

  bool empty() const { return codes_.empty(); }
  size_t size() const { return codes_.size(); }

  // Appends every non-empty match of every pattern in text[from, ...), each
  // pattern's leftmost first and not overlapping one another (different
  // patterns may overlap). Lookbehinds see text before `from`. Returns false
  // when a pattern hit PCRE2's limits on this text (its later matches are
  // not searched).
  bool find_all(std::string_view text, size_t from, std::vector<TextSpan>& out) const;

 private:
  struct Code;
  static std::unique_ptr<Code> compile(size_t index, std::string_view shown,
                                       const std::string& pattern, uint32_t options);
  std::vector<std::unique_ptr<Code>> codes_;
};

// The PCRE2 pattern that matches `word` as PatternList::keywords does.
std::string keyword_pattern(std::string_view word);

struct GuardrailsConfig;
// The list of the guardrails file's `key`; nk::Error naming the file, line,
// key and item of an entry that does not compile.
PatternList compile_rail_patterns(const GuardrailsConfig& c, const std::string& key,
                                  const std::vector<std::string>& items, bool keywords);

}  // namespace nk
