// A compiled PCRE2 pattern (Perl/Python syntax, UTF-8, Unicode classes) for
// the rule-based rewards: the answer a completion states, the template it
// must follow. Matching is not thread-safe (one match-data block per
// pattern); a RewardSet scores one batch at a time.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace nk {

class RewardRegex {
 public:
  // `dotall`: `.` matches newlines too. nk::Error naming `key`, the pattern
  // and the offset for a pattern that does not compile.
  RewardRegex(const std::string& key, const std::string& pattern, bool dotall = false);
  ~RewardRegex();
  RewardRegex(const RewardRegex&) = delete;
  RewardRegex& operator=(const RewardRegex&) = delete;

  // Whether the whole of `text` matches (Python's re.fullmatch).
  bool full_match(std::string_view text) const;
  // The first match's first capture group (the whole match when the pattern
  // has no group, or the group did not take part); nullopt when none.
  std::optional<std::string> first(std::string_view text) const;
  // The same of the last match (matches do not overlap, as re.findall).
  std::optional<std::string> last(std::string_view text) const;
  uint32_t groups() const { return groups_; }
  const std::string& pattern() const { return pattern_; }

 private:
  std::optional<std::string> find(std::string_view text, bool last) const;
  std::string key_, pattern_;
  void* code_ = nullptr;  // pcre2_code_8
  void* md_ = nullptr;    // pcre2_match_data_8
  uint32_t groups_ = 0;
};

}  // namespace nk
