// Output rails: what the model's answer may not carry.
//
//   output.pii            curate's PII scanner (curate/filters/pii.h); each
//                         span replaced by its placeholder
//   output.blocked_words  words or phrases (as input.blocked_keywords match)
//   output.blocked_regex  PCRE2 patterns
//                         both masked (output.mask) or, with blocked_action
//                         refuse, ending the answer with the refusal
//
// OutputFilter applies them to an answer as it streams. Text is held back
// until it can no longer be part of a match: a match is acted on once
// `window` characters follow it (or the answer ended), and text is released
// up to `window` characters before the end, never past the start of a
// match still open. So whenever every match, with the characters that
// decide where it ends, is shorter than the window, the streamed text is
// exactly what the whole answer filtered at once gives, wherever the token
// boundaries fall. (A longer match is held back whole while it grows, so
// nothing of it escapes once it is seen; but a match first recognisable
// more than `window` characters after its start, such as an e-mail with a
// 300-character domain, may have begun in text already released, and only
// its unreleased rest is replaced.)
//
// A scan that hits PCRE2's match limit counts as a refusal (fail closed).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "serve/guardrails_config.h"
#include "serve/guardrails_patterns.h"

namespace nk {

class OutputRails {
 public:
  enum Rail : int { kPii = 0, kWords = 1, kRegex = 2 };
  static constexpr int kRails = 3;

  struct Match {
    size_t begin = 0, end = 0;  // bytes of the text
    int rail = kPii;
    bool refuse = false;           // the answer ends (blocked_action refuse)
    std::string_view replacement;  // for a masking match; owned by the rails (or static)
  };

  // nk::Error naming the file, line, key and item of a pattern that does
  // not compile.
  explicit OutputRails(const GuardrailsConfig& c);

  bool empty() const { return pii_mask_ == 0 && words_.empty() && regex_.empty(); }
  bool on(int rail) const;
  // "output.pii", "output.blocked_words", "output.blocked_regex"
  static const char* name(int rail);
  size_t window() const { return window_; }  // characters

  // Appends every match that starts at or after byte `from` of `text` (a
  // character boundary; patterns' lookbehinds see before it). Returns -1, or
  // the rail whose pattern hit PCRE2's limits.
  int scan(std::string_view text, size_t from, std::vector<Match>& out) const;

 private:
  uint32_t pii_mask_ = 0;
  std::string pii_placeholder_;  // "": the typed ones
  PatternList words_, regex_;
  bool refuse_ = false;
  std::string mask_;
  size_t window_ = 256;
};

// One answer (choice) through the output rails, piece by piece.
class OutputFilter {
 public:
  explicit OutputFilter(const OutputRails& rails) : rails_(&rails) {}

  // Takes the next piece of the answer; returns the text that became final
  // with it (redacted), "" while it is held back or once refused().
  std::string push(std::string_view piece);
  // The answer ended: the rest, checked and redacted ("" once refused()).
  std::string finish();
  // A refusing rail matched: nothing more is released; the caller ends the
  // answer with the refusal.
  bool refused() const { return refused_; }
  // Bit r set: rail r replaced something or refused.
  uint32_t triggered() const { return triggered_; }

  // The whole answer at once (non-streamed responses): `text` redacted, or
  // refused() set.
  std::string whole(std::string_view text);

 private:
  std::string release(bool at_end);

  const OutputRails* rails_;
  std::string text_;  // the answer so far, as generated
  size_t done_ = 0;   // bytes of text_ released (or replaced)
  bool refused_ = false;
  uint32_t triggered_ = 0;
  std::vector<OutputRails::Match> matches_;  // scratch
};

}  // namespace nk
