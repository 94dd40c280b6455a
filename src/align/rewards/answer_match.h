// The accuracy reward's rules (verifiable rewards, as TRL's accuracy_reward,
// lm-evaluation-harness's GSM8K filters and veRL's math scorers): the answer
// a text states, extracted by one rule, compared with the reference answer
// as a number or as a string.
//
//   gsm8k        the first "#### <number>" (GSM8K's own answer line)
//   boxed        the content of the last \boxed{...} (or \fbox{...}), braces balanced
//   marker       the rest of the line after the last marker ("The answer is",
//                any ASCII case), without a leading ':' or a trailing '.'
//   last_number  the last number in the text ("1,234.5", "-3", "3/4")
//   regex        the first match of a pattern: its first capture group, else the whole match
//
// The reference goes through the same rule (GSM8K's "...\n#### 72" gives
// "72"), its whole trimmed text when the rule finds nothing there (or with
// reference=as_is). Compared as numbers: '$', ',', spaces, a leading '+', a
// trailing '.' or '%' dropped, "a/b" read as a fraction, and a text that is
// not one number read as its first number ("72 dollars"); equal within an
// absolute tolerance. As strings: trimmed, optionally case-folded (Unicode).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "align/rewards/reward_regex.h"

namespace nk {

struct AccuracyRewardOptions {
  std::string answer_key = "answer";  // the record's field holding the reference answer
  std::string extract = "gsm8k";      // gsm8k | boxed | marker | last_number | regex
  std::string pattern;                // extract=regex
  std::string marker = "The answer is";
  std::string reference = "extract";  // extract | as_is
  std::string compare = "number";     // number | exact
  double tolerance = 1e-6;            // compare=number: |answer - reference| <= tolerance
  bool ignore_case = false;           // compare=exact

  // nk::Error naming the align.reward_accuracy.* key for a bad value.
  void check() const;
};

// A number as answers write it (see above); nullopt when `s` is not one.
std::optional<double> parse_answer_number(std::string_view s);

// The content of the last \boxed{...} or \fbox{...} of `s`, braces balanced
// and trimmed; nullopt when there is none (or it is not closed).
std::optional<std::string> last_boxed(std::string_view s);

class AnswerMatcher {
 public:
  explicit AnswerMatcher(const AccuracyRewardOptions& opt);
  ~AnswerMatcher();

  // The answer `text` states; nullopt when the rule finds none.
  std::optional<std::string> extract(std::string_view text) const;
  // The reference answer of a record's field (see above).
  std::string reference(std::string_view text) const;
  // Whether `answer` equals `reference` under the comparison. nk::Error when
  // comparing numbers and the reference is not a number.
  bool same(const std::string& answer, const std::string& reference) const;
  // 1 when `completion` states the reference answer, else 0.
  double score(std::string_view completion, std::string_view reference_text) const;

 private:
  std::optional<std::string> marker_answer(std::string_view text) const;
  std::optional<double> number_in(const std::string& s) const;
  AccuracyRewardOptions opt_;
  std::unique_ptr<RewardRegex> rule_;    // gsm8k, last_number, regex
  std::unique_ptr<RewardRegex> number_;  // the first number of a text
};

}  // namespace nk
