// TextView, n-gram hashing and the registration of every heuristic filter.
#include "curate/filters/filters.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <memory>

#include "curate/stages.h"
#include "curate/words.h"

namespace nk::curate {

namespace {

struct TextScratch {
  std::vector<std::string_view> words, lines;
  std::vector<uint32_t> word_chars;
  std::vector<uint64_t> word_hashes;
  // The text the word measures were computed for. Consecutive filter stages
  // see the same document, usually unchanged: they reuse its words rather
  // than split them again (the views point into that same buffer).
  const char* words_data = nullptr;
  size_t words_size = 0;
  uint64_t words_hash = 0;
  bool words_ok = false, word_chars_ok = false, word_hashes_ok = false;
};

TextScratch& scratch() {
  thread_local TextScratch s;
  return s;
}

}  // namespace

TextView::TextView(std::string_view text) : text_(text) {}

size_t TextView::chars() {
  if (!have_chars_) {
    chars_ = utf8_length(text_);
    have_chars_ = true;
  }
  return chars_;
}

const std::vector<std::string_view>& TextView::words() {
  TextScratch& s = scratch();
  if (!have_words_) {
    // Same buffer, same length, same contents (64-bit hash): the last stage's
    // words still hold.
    uint64_t h = XXH3_64bits(text_.data(), text_.size());
    if (!(s.words_ok && s.words_data == text_.data() && s.words_size == text_.size() &&
          s.words_hash == h)) {
      s.words.clear();
      split_words(text_, s.words);
      s.words_data = text_.data();
      s.words_size = text_.size();
      s.words_hash = h;
      s.words_ok = true;
      s.word_chars_ok = s.word_hashes_ok = false;
    }
    have_words_ = true;
  }
  return s.words;
}

const std::vector<uint32_t>& TextView::word_chars() {
  TextScratch& s = scratch();
  if (!have_word_chars_) {
    const auto& w = words();
    if (!s.word_chars_ok) {
      s.word_chars.resize(w.size());
      for (size_t i = 0; i < w.size(); ++i) s.word_chars[i] = uint32_t(utf8_length(w[i]));
      s.word_chars_ok = true;
    }
    have_word_chars_ = true;
  }
  return s.word_chars;
}

const std::vector<uint64_t>& TextView::word_hashes() {
  TextScratch& s = scratch();
  if (!have_word_hashes_) {
    const auto& w = words();
    if (!s.word_hashes_ok) {
      s.word_hashes.resize(w.size());
      for (size_t i = 0; i < w.size(); ++i)
        s.word_hashes[i] = XXH3_64bits(w[i].data(), w[i].size());
      s.word_hashes_ok = true;
    }
    have_word_hashes_ = true;
  }
  return s.word_hashes;
}

const std::vector<std::string_view>& TextView::lines() {
  TextScratch& s = scratch();
  if (!have_lines_) {
    s.lines.clear();
    size_t start = 0;
    while (true) {
      size_t nl = text_.find('\n', start);
      size_t end = nl == std::string_view::npos ? text_.size() : nl;
      std::string_view line = text_.substr(start, end - start);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      s.lines.push_back(line);
      if (nl == std::string_view::npos) break;
      start = nl + 1;
    }
    have_lines_ = true;
  }
  return s.lines;
}

void ngram_hashes(const std::vector<uint64_t>& h, size_t n, std::vector<uint64_t>& out) {
  out.clear();
  if (n == 0 || h.size() < n) return;
  // H(i) = sum_k h[i+k] * B^(n-1-k) mod 2^64, rolled forward one word at a time.
  constexpr uint64_t B = 0x9E3779B97F4A7C15ull;  // odd, so multiplication is invertible
  uint64_t top = 1;                              // B^(n-1)
  for (size_t k = 1; k < n; ++k) top *= B;
  uint64_t x = 0;
  for (size_t k = 0; k < n; ++k) x = x * B + h[k];
  out.resize(h.size() - n + 1);
  for (size_t i = 0;; ++i) {
    // splitmix64's finalizer spreads the sum over all bits (table index = low bits).
    uint64_t z = x ^ (x >> 30);
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBull;
    out[i] = z ^ (z >> 31);
    if (i + n >= h.size()) break;
    x = (x - h[i] * top) * B + h[i + n];
  }
}

bool ends_in_terminal_punctuation(std::string_view l) {
  if (l.empty()) return false;
  char c = l.back();
  if (c == '.' || c == '\'' || c == '"' || c == '!' || c == '?') return true;
  return l.ends_with("\u3002") || l.ends_with("\uFF01") || l.ends_with("\uFF1F");
}

bool contains_ascii_ci(std::string_view h, std::string_view needle) {
  if (needle.empty()) return true;
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c | 0x20) : c; };
  for (size_t i = 0; i + needle.size() <= h.size(); ++i) {
    size_t k = 0;
    while (k < needle.size() && lower(h[i + k]) == needle[k]) ++k;
    if (k == needle.size()) return true;
  }
  return false;
}

std::string ratio_str(double x) {
  return fmt::format("{:.4g}", x);
}

void read_ratio(StageConfig& c, const std::string& key, double& field, const std::string& doc) {
  c.bind(key, field, doc);
  if (!(field >= 0.0 && field <= 1.0))
    c.fail_key(key, fmt::format("expected a ratio in [0, 1], got {}", field));
}

void read_ngram_limits(StageConfig& c, const std::string& key,
                       std::vector<std::pair<int, double>>& field, const std::string& doc) {
  std::vector<std::pair<std::string, double>> given;
  for (const auto& [n, f] : field) given.emplace_back(std::to_string(n), f);
  c.bind(key, given, doc);
  std::vector<std::pair<int, double>> out;
  for (const auto& [k, f] : given) {
    int n = 0;
    try {
      size_t pos = 0;
      n = std::stoi(k, &pos);
      if (pos != k.size()) n = 0;
    } catch (const std::exception&) {
      n = 0;
    }
    if (n < 1 || n > 64)
      c.fail_key(key, fmt::format("n-gram size '{}' must be an integer in 1..64", k));
    if (!(f >= 0.0 && f <= 1.0))
      c.fail_key(key, fmt::format("entry {}: expected a ratio in [0, 1], got {}", k, f));
    out.emplace_back(n, f);
  }
  field = std::move(out);
}

namespace {

template <class... Rules>
void add_rules(StageRegistry& r, std::string type, std::string help) {
  r.add({std::move(type), std::move(help),
         [](StageConfig& c) -> std::unique_ptr<DocStage> {
           return std::make_unique<RuleStage<Rules...>>(c);
         },
         nullptr});
}

}  // namespace

void register_filter_stages(StageRegistry& r) {
  // Gopher quality rules, one per stage, then the bundle.
  add_rules<WordCountRule>(r, "word_count", "remove documents outside min_words..max_words words");
  add_rules<MeanWordLengthRule>(r, "mean_word_length",
                                "remove documents whose mean word length (code points) is outside "
                                "min_avg_word_length..max_avg_word_length");
  add_rules<SymbolWordRule>(r, "symbol_word_ratio",
                            "remove documents with more '#' or ellipses per word than "
                            "max_symbol_word_ratio");
  add_rules<BulletLinesRule>(r, "bullet_lines",
                             "remove documents whose fraction of lines starting with a bullet "
                             "exceeds max_bullet_lines_ratio");
  add_rules<EllipsisLinesRule>(r, "ellipsis_lines",
                               "remove documents whose fraction of lines ending in an ellipsis "
                               "exceeds max_ellipsis_lines_ratio");
  add_rules<AlphaWordsRule>(r, "alpha_words",
                            "remove documents whose fraction of words with a letter is below "
                            "min_alpha_words_ratio");
  add_rules<StopWordsRule>(r, "stop_words",
                           "remove documents with fewer than min_stop_words stop words (per "
                           "language)");
  add_rules<WordCountRule, MeanWordLengthRule, SymbolWordRule, BulletLinesRule, EllipsisLinesRule,
            AlphaWordsRule, StopWordsRule>(r, "gopher_quality",
                                           "all Gopher quality rules (Rae et al. 2021)");
  // Gopher repetition rules.
  add_rules<DuplicateLinesRule>(r, "duplicate_lines",
                                "remove documents with too many duplicated lines");
  add_rules<DuplicateParagraphsRule>(r, "duplicate_paragraphs",
                                     "remove documents with too many duplicated paragraphs");
  add_rules<TopNgramsRule>(r, "top_ngrams",
                           "remove documents whose most frequent word n-gram covers too many "
                           "characters");
  add_rules<DuplicateNgramsRule>(r, "duplicate_ngrams",
                                 "remove documents whose repeated word n-grams cover too many "
                                 "characters");
  add_rules<DuplicateParagraphsRule, DuplicateLinesRule, TopNgramsRule, DuplicateNgramsRule>(
      r, "gopher_repetition", "all Gopher repetition rules (Rae et al. 2021)");
  // FineWeb rules.
  add_rules<TerminalPunctuationRule>(r, "terminal_punctuation",
                                     "remove documents with too few lines ending in terminal "
                                     "punctuation (FineWeb)");
  add_rules<ShortLinesRule>(r, "short_lines",
                            "remove documents with too many short lines (FineWeb)");
  add_rules<CharDuplicatesRule>(r, "char_duplicates",
                                "remove documents whose duplicated lines hold too many characters "
                                "(FineWeb)");
  add_rules<NewLineRatioRule>(r, "new_line_ratio",
                              "remove documents with too many newlines per word (FineWeb)");
  add_rules<TerminalPunctuationRule, ShortLinesRule, CharDuplicatesRule, NewLineRatioRule>(
      r, "fineweb", "all FineWeb quality rules (Penedo et al. 2024)");
  // C4 and NeMo Curator rules.
  r.add({"c4",
         "C4 line cleaning (terminal punctuation, short lines, javascript, policy lines) and "
         "document rules (lorem ipsum, curly bracket, too few sentences); rewrites the text",
         make_c4_stage, nullptr});
  add_rules<UrlRatioRule>(r, "url_ratio",
                          "remove documents whose URLs hold more than max_url_to_text_ratio of "
                          "the characters");
  add_rules<NonAlphaNumericRule>(r, "non_alphanumeric",
                                 "remove documents with more than "
                                 "max_non_alpha_numeric_to_text_ratio non-alphanumeric characters");
  add_rules<BoilerplateStringsRule>(r, "boilerplate_strings",
                                    "remove documents with lorem ipsum, or too many or top/bottom "
                                    "paragraphs of policy/cookie boilerplate");
}

}  // namespace nk::curate
