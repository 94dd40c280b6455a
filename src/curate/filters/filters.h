// Heuristic quality filters (Gopher, C4, FineWeb, NeMo Curator), shared by the
// filters_*.cc files. Each rule is a small struct that reads its own YAML keys
// and checks one document; a stage type is a list of rules (RuleStage), so the
// bundles (gopher_quality, gopher_repetition, fineweb) run exactly the same
// code as the single-rule stages, with the same keys.
//
// Character counts are Unicode code points (Python's len(str), which is what
// the published implementations measure); words come from split_words
// (words.h), so Chinese, Japanese and Thai are counted in dictionary words.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "curate/document.h"
#include "curate/stage_config.h"

namespace nk::curate {

// The measures of one document's text, each computed on first use and kept in
// thread_local buffers: at most one TextView per thread may be alive (apply()
// creates one and drops it before returning).
class TextView {
 public:
  explicit TextView(std::string_view text);
  TextView(const TextView&) = delete;
  TextView& operator=(const TextView&) = delete;

  std::string_view text() const { return text_; }
  size_t chars();                                // code points
  const std::vector<std::string_view>& words();  // split_words
  const std::vector<uint32_t>& word_chars();     // code points of each word
  const std::vector<uint64_t>& word_hashes();    // 64-bit hash of each word's bytes
  // str.split("\n") as in Python (n newlines give n + 1 lines), '\r' stripped.
  const std::vector<std::string_view>& lines();

 private:
  std::string_view text_;
  bool have_chars_ = false, have_words_ = false, have_word_chars_ = false,
       have_word_hashes_ = false, have_lines_ = false;
  size_t chars_ = 0;
};

// Hash of word n-grams [i, i + n) for every i, from per-word hashes (a
// polynomial rolling hash, then a finalizer): O(words), no strings built.
void ngram_hashes(const std::vector<uint64_t>& word_hashes, size_t n, std::vector<uint64_t>& out);

// Duplicate items of a list (after the first occurrence of each), compared by
// 64-bit hash; `dup_chars` in code points. Shared by the Gopher and FineWeb rules.
struct DupStats {
  size_t items = 0, dups = 0, dup_chars = 0;
};
DupStats find_duplicates(const std::vector<std::string_view>& items);

// Ends in . ' " ! ? (FineWeb's and C4's terminal punctuation) or in the
// full-width 。！？ (our addition, so that Chinese and Japanese prose passes).
bool ends_in_terminal_punctuation(std::string_view line);

// ASCII case-insensitive search for a lowercase ASCII `needle`.
bool contains_ascii_ci(std::string_view haystack, std::string_view needle);

// A reason such as "word_count 12 < 50". Ratios print with 4 significant digits.
std::string ratio_str(double x);

// ---- The rules. `check` returns why the document goes, or nothing. -------------

using Reason = std::optional<std::string>;

// Gopher (Rae et al. 2021, Table A1 / datatrove GopherQualityFilter).
struct WordCountRule {
  int64_t min_words = 50, max_words = 100000;
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};
struct MeanWordLengthRule {
  double min_avg = 3, max_avg = 10;
  bool count_unspaced = false;  // words of Han/Kana/Thai/... scripts (see filters_gopher.cc)
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};
struct SymbolWordRule {
  double max_ratio = 0.1;
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};
struct BulletLinesRule {
  double max_ratio = 0.9;
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};
struct EllipsisLinesRule {
  double max_ratio = 0.3;
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};
struct AlphaWordsRule {
  double min_ratio = 0.8;
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};
struct StopWordsRule {
  int64_t min_stop_words = 2;
  std::vector<std::string> words;  // `stop_words:` override (lowercase); empty: built-in lists
  // The list for documents without a `language` label; "" (the default):
  // such documents are not checked (counted, with one warning), since an
  // assumed English list removes nearly all text in other languages.
  std::string default_language;
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};

// Gopher repetition (Rae et al. 2021, Table A1 / datatrove GopherRepetitionFilter).
struct DuplicateLinesRule {
  double max_frac = 0.3, max_char_frac = 0.2;
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};
struct DuplicateParagraphsRule {
  double max_frac = 0.3, max_char_frac = 0.2;
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};
struct TopNgramsRule {
  std::vector<std::pair<int, double>> limits = {{2, 0.20}, {3, 0.18}, {4, 0.16}};
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};
struct DuplicateNgramsRule {
  std::vector<std::pair<int, double>> limits = {{5, 0.15}, {6, 0.14}, {7, 0.13},
                                                {8, 0.12}, {9, 0.11}, {10, 0.10}};
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};

// FineWeb (Penedo et al. 2024 / datatrove FineWebQualityFilter).
struct TerminalPunctuationRule {
  double threshold = 0.12;  // removed when the ratio is <= this
  bool exclude_zero = false;
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};
struct ShortLinesRule {
  double threshold = 0.67;  // removed when the ratio is >= this
  int64_t max_length = 30;
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};
struct CharDuplicatesRule {
  double threshold = 0.01;  // removed when the ratio is >= this
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};
struct NewLineRatioRule {
  double max_ratio = 0.3;
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};

// NeMo Curator heuristic filters (nemo_curator/filters/heuristic_filter.py).
struct UrlRatioRule {
  double max_ratio = 0.2;
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};
struct NonAlphaNumericRule {
  double max_ratio = 0.25;
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};
struct BoilerplateStringsRule {
  double max_ratio = 0.4;
  bool remove_if_at_top_or_bottom = true;
  void read(StageConfig& c);
  Reason check(const Document& d, TextView& v, Counters& c) const;
};

// A DocStage that runs its rules in order and stops at the first that removes.
template <class... Rules>
class RuleStage final : public DocStage {
 public:
  explicit RuleStage(StageConfig& c) {
    std::apply([&](auto&... r) { (r.read(c), ...); }, rules_);
  }
  Verdict apply(Document& doc, Counters& counts) const override {
    TextView v(doc.text);
    Reason why;
    std::apply([&](const auto&... r) { (... || (why = r.check(doc, v, counts)).has_value()); },
               rules_);
    return why ? Verdict::removed(std::move(*why)) : Verdict::kept();
  }

 private:
  std::tuple<Rules...> rules_;
};

// C4's line-level cleaning (rewrites the text); in filters_c4.cc.
std::unique_ptr<DocStage> make_c4_stage(StageConfig& c);

// StageConfig::bind with range checks: a ratio in [0, 1]; n-gram sizes 1..64
// mapped to ratios, as {2: 0.2, 3: 0.18}.
void read_ratio(StageConfig& c, const std::string& key, double& field, const std::string& doc);
void read_ngram_limits(StageConfig& c, const std::string& key,
                       std::vector<std::pair<int, double>>& field, const std::string& doc);

}  // namespace nk::curate
