// Pre-tokenization: splitting text into the pieces that byte-level BPE merges
// within (tiktoken's pat_str). Any regex in tiktoken's syntax works, through
// PCRE2 (UTF + UCP + JIT), so a saved tokenizer can carry its own pattern.
//
// Matching follows tiktoken (Rust regex / fancy-regex) rather than PCRE2's own
// defaults where they differ: `\s` and `\S` mean Unicode White_Space (PCRE2
// would also count U+180E). `\p{..}` comes from PCRE2's tables: Unicode 14 in
// PCRE2 10.42, while tiktoken's regex crate has Unicode 16, so characters first
// assigned in Unicode 15.0-16.0 (CJK Ext. H/I, Kawi, Garay, ...) are not
// letters here and may split differently; everything older matches exactly.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace nk {

// A non-owning reference to a callable `void(std::string_view)` (the piece
// callback), cheaper than std::function on the per-piece path.
class PieceFn {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, PieceFn>>>
  PieceFn(F&& f)  // NOLINT: implicit by design
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, std::string_view s) {
          (*static_cast<std::remove_reference_t<F>*>(o))(s);
        }) {}
  void operator()(std::string_view s) const { call_(obj_, s); }

 private:
  void* obj_;
  void (*call_)(void*, std::string_view);
};

class PreTokenizer {
 public:
  // nk::Error naming the pattern and the offset for a regex that does not compile.
  explicit PreTokenizer(std::string pattern);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  const std::string& pattern() const { return pattern_; }
  // Whether PCRE2 finds a match of the pattern possible in an empty subject
  // (its minimum match length is 0: `\s*`, `\b`, `(?=x)`).
  bool can_match_empty() const;

  // Calls fn(piece) for each match of the pattern in `text`, left to right.
  // Bytes no match covers are skipped and empty matches yield nothing, as in
  // tiktoken. Thread-safe: many threads may split with one PreTokenizer.
  // nk::Error (with the byte offset) if `text` is not valid UTF-8: repair it
  // first with replace_invalid_utf8 (data/utf8.h), as the tokenizers do.
  void for_each_piece(std::string_view text, PieceFn fn) const;
  // As for_each_piece, for text the caller has already validated (unchecked:
  // PCRE2 reads invalid UTF-8 out of bounds).
  void for_each_piece_valid(std::string_view text, PieceFn fn) const;

  // The pieces as views into `text`.
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  struct Compiled;
  std::string pattern_;
  std::unique_ptr<Compiled> re_;
};

// Rewrites `\s`/`\S` of a tiktoken pattern into explicit Unicode White_Space
// classes for PCRE2. Exposed for tests.
std::string pcre2_pattern_for(std::string_view tiktoken_pattern);

}  // namespace nk
