// Gopher quality and repetition rules.
//
// Source of every default: Rae et al. 2021, "Scaling Language Models: Methods,
// Analysis & Insights from Training Gopher", section A.1.1 and Table A1, as
// implemented in datatrove's GopherQualityFilter / GopherRepetitionFilter (the
// YAML keys are datatrove's argument names). Where we differ from datatrove on
// purpose, the rule says so.
#include <fmt/format.h>
#include <unicode/uchar.h>
#include <unicode/uscript.h>
#include <unicode/utf8.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <mutex>

#include "core/log.h"
#include "curate/filters/filters.h"
#include "curate/words.h"

namespace nk::curate {

namespace {

inline UChar32 first_cp(std::string_view s) {
  int32_t i = 0;
  UChar32 c;
  U8_NEXT(s.data(), i, int32_t(s.size()), c);
  return c;
}

inline bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ascii_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ascii_space(s.back())) s.remove_suffix(1);
  return s;
}

bool has_letter(std::string_view w) {
  for (size_t i = 0; i < w.size();) {
    unsigned char b = static_cast<unsigned char>(w[i]);
    if (b < 0x80) {
      if ((b | 0x20) >= 'a' && (b | 0x20) <= 'z') return true;
      ++i;
      continue;
    }
    int32_t j = int32_t(i);
    UChar32 c;
    U8_NEXT(w.data(), j, int32_t(w.size()), c);
    if (c >= 0 && u_isalpha(c)) return true;
    i = size_t(j);
  }
  return false;
}

// Counts of a 64-bit key (0 is the empty slot; a key of 0 is stored as 1).
class HashCounter {
 public:
  void reset(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    keys_.assign(cap, 0);
    counts_.assign(cap, 0);
    mask_ = cap - 1;
  }
  // Adds one to `k`'s count and returns the new count.
  uint32_t add(uint64_t k) {
    if (k == 0) k = 1;
    size_t i = size_t(k) & mask_;
    while (keys_[i] != 0 && keys_[i] != k) i = (i + 1) & mask_;
    keys_[i] = k;
    return ++counts_[i];
  }
  uint32_t count(uint64_t k) const {
    if (k == 0) k = 1;
    size_t i = size_t(k) & mask_;
    while (keys_[i] != 0 && keys_[i] != k) i = (i + 1) & mask_;
    return keys_[i] == k ? counts_[i] : 0;
  }

 private:
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> counts_;
  size_t mask_ = 0;
};

HashCounter& counter() {
  thread_local HashCounter c;
  return c;
}

// Characters covered by a union of word intervals [i, i + n) given in
// increasing i: the covered words' code points plus one separator between two
// adjacent covered words (the " ".join of the published definitions), never
// counting a word twice.
class Coverage {
 public:
  Coverage(const std::vector<uint32_t>& word_chars, size_t n) : len_(word_chars), n_(n) {}
  void add(size_t i) {
    size_t from = std::max(i, end_);
    for (size_t j = from; j < i + n_; ++j) {
      chars_ += len_[j];
      if (j > i || (any_ && j == end_)) ++chars_;  // word j-1 is covered too
    }
    end_ = std::max(end_, i + n_);
    any_ = true;
  }
  size_t chars() const { return chars_; }

 private:
  const std::vector<uint32_t>& len_;
  size_t n_, end_ = 0, chars_ = 0;
  bool any_ = false;
};

std::string no_words(const char* rule) {
  return std::string(rule) + ": no words";
}

}  // namespace

DupStats find_duplicates(const std::vector<std::string_view>& items) {
  DupStats s;
  HashCounter& seen = counter();
  seen.reset(items.size());
  for (std::string_view it : items) {
    ++s.items;
    if (seen.add(XXH3_64bits(it.data(), it.size())) > 1) {
      ++s.dups;
      s.dup_chars += utf8_length(it);
    }
  }
  return s;
}

// ---- Gopher quality --------------------------------------------------------------

void WordCountRule::read(StageConfig& c) {
  c.bind("min_words", min_words, "fewest words a kept document has");
  c.bind("max_words", max_words, "most words a kept document has");
  if (min_words < 0) c.fail_key("min_words", "must be >= 0");
  if (max_words < min_words) c.fail_key("max_words", "must be >= min_words");
}

Reason WordCountRule::check(const Document&, TextView& v, Counters&) const {
  int64_t n = int64_t(v.words().size());
  if (n < min_words) return fmt::format("word_count {} < {}", n, min_words);
  if (n > max_words) return fmt::format("word_count {} > {}", n, max_words);
  return {};
}

void MeanWordLengthRule::read(StageConfig& c) {
  c.bind("min_avg_word_length", min_avg, "shortest mean word length kept (code points)");
  c.bind("max_avg_word_length", max_avg, "longest mean word length kept (code points)");
  c.bind("count_unspaced_scripts", count_unspaced,
         "count words of Chinese, Japanese, Thai... in the mean");
  if (min_avg < 0) c.fail_key("min_avg_word_length", "must be >= 0");
  if (max_avg < min_avg) c.fail_key("max_avg_word_length", "must be >= min_avg_word_length");
}

// Deviation: words of unspaced scripts (Chinese, Japanese, Thai, ...) are left
// out of the mean unless count_unspaced_scripts is set, and a document whose
// word characters are mostly in such scripts (at least half of the words'
// code points) passes unmeasured, counted as "mean_word_length_unspaced".
//
// Why not measure those words as ICU's dictionary segments them (words.cc;
// what count_unspaced_scripts measures): Gopher's bounds (3 to 10) are for
// words between spaces, and none are published for dictionary segments.
// ICU's Chinese words are 1.2 to 1.6 code points on average (fortunes-zh,
// dpkg's and apt's zh_CN messages) and Japanese 2.0, so the same bounds would
// remove nearly all such prose; Thai's (3.6 to 3.7) fall inside them only by
// chance. Why the share: measured on its spaced words alone, such a text was
// judged by its few Latin and digit tokens ("%lu", "apt", an escape's "33m"),
// which removed 4961 of fortunes-zh's 5165 entries and 24 to 46% of dpkg's and
// apt's zh_CN, ja and th messages; a mostly English text with a few Chinese
// words is still measured on its English words.
Reason MeanWordLengthRule::check(const Document&, TextView& v, Counters& counts) const {
  const auto& w = v.words();
  if (w.empty()) return no_words("mean_word_length");
  const auto& len = v.word_chars();
  size_t n = 0, total = 0, unspaced = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (!count_unspaced && static_cast<unsigned char>(w[i][0]) >= 0xE0 &&
        is_unspaced_script(first_cp(w[i]))) {
      unspaced += len[i];
      continue;
    }
    ++n;
    total += len[i];
  }
  if (n == 0 || unspaced >= total) {
    ++counts["mean_word_length_unspaced"];
    return {};
  }
  double mean = double(total) / double(n);
  if (mean < min_avg) return fmt::format("mean_word_length {} < {}", ratio_str(mean), min_avg);
  if (mean > max_avg) return fmt::format("mean_word_length {} > {}", ratio_str(mean), max_avg);
  return {};
}

void SymbolWordRule::read(StageConfig& c) {
  c.bind("max_symbol_word_ratio", max_ratio, "most '#' or ellipses per word kept");
  if (max_ratio < 0) c.fail_key("max_symbol_word_ratio", "must be >= 0");
}

// Gopher: "symbol-to-word ratio greater than 0.1 for either the hash symbol or
// the ellipsis"; ellipses are "..." (non-overlapping) and U+2026.
Reason SymbolWordRule::check(const Document&, TextView& v, Counters&) const {
  size_t words = v.words().size();
  if (words == 0) return no_words("symbol_word_ratio");
  std::string_view t = v.text();
  size_t hashes = 0, ellipses = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    char c = t[i];
    if (c == '#') {
      ++hashes;
    } else if (c == '.' && i + 2 < t.size() && t[i + 1] == '.' && t[i + 2] == '.') {
      ++ellipses;
      i += 2;
    } else if (c == '\xE2' && i + 2 < t.size() && t[i + 1] == '\x80' && t[i + 2] == '\xA6') {
      ++ellipses;
      i += 2;
    }
  }
  double h = double(hashes) / double(words), e = double(ellipses) / double(words);
  if (h > max_ratio) return fmt::format("hash_word_ratio {} > {}", ratio_str(h), max_ratio);
  if (e > max_ratio) return fmt::format("ellipsis_word_ratio {} > {}", ratio_str(e), max_ratio);
  return {};
}

// Gopher line rules count non-blank lines (deviation: datatrove's splitlines()
// also counts blank lines, which makes the ratios depend on paragraph spacing).
namespace {

template <class Pred>
std::pair<size_t, size_t> count_lines(TextView& v, Pred pred) {
  size_t n = 0, hit = 0;
  for (std::string_view line : v.lines()) {
    line = trim(line);
    if (line.empty()) continue;
    ++n;
    hit += pred(line) ? 1 : 0;
  }
  return {hit, n};
}

// NeMo Curator's bullet list (nemo_curator/utils/constants.py); Gopher names "•".
constexpr std::array<std::string_view, 12> kBullets = {"•", "‣", "⁃", "⁌", "⁍", "∙",
                                                       "○", "●", "◘", "◦", "⦾", "⦿"};

}  // namespace

void BulletLinesRule::read(StageConfig& c) {
  read_ratio(c, "max_bullet_lines_ratio", max_ratio, "most lines starting with a bullet kept");
}

Reason BulletLinesRule::check(const Document&, TextView& v, Counters&) const {
  if (v.words().empty()) return no_words("bullet_lines");
  auto [hit, n] = count_lines(v, [](std::string_view l) {
    for (std::string_view b : kBullets)
      if (l.starts_with(b)) return true;
    return false;
  });
  double r = double(hit) / double(n);
  if (r > max_ratio) return fmt::format("bullet_lines {} > {}", ratio_str(r), max_ratio);
  return {};
}

void EllipsisLinesRule::read(StageConfig& c) {
  read_ratio(c, "max_ellipsis_lines_ratio", max_ratio, "most lines ending in an ellipsis kept");
}

Reason EllipsisLinesRule::check(const Document&, TextView& v, Counters&) const {
  if (v.words().empty()) return no_words("ellipsis_lines");
  auto [hit, n] = count_lines(
      v, [](std::string_view l) { return l.ends_with("...") || l.ends_with("\u2026"); });
  double r = double(hit) / double(n);
  if (r > max_ratio) return fmt::format("ellipsis_lines {} > {}", ratio_str(r), max_ratio);
  return {};
}

void AlphaWordsRule::read(StageConfig& c) {
  read_ratio(c, "min_alpha_words_ratio", min_ratio, "fewest words with a letter kept");
}

// Gopher: "80% of words in a document contain at least one alphabetic
// character" (any Unicode letter: Han and Thai characters are letters).
Reason AlphaWordsRule::check(const Document&, TextView& v, Counters&) const {
  const auto& w = v.words();
  if (w.empty()) return no_words("alpha_words");
  size_t alpha = 0;
  for (std::string_view x : w) alpha += has_letter(x) ? 1 : 0;
  double r = double(alpha) / double(w.size());
  if (r < min_ratio) return fmt::format("alpha_words {} < {}", ratio_str(r), min_ratio);
  return {};
}

// ---- Stop words --------------------------------------------------------------------

namespace {

struct StopList {
  std::string_view lang;
  std::vector<std::string_view> words;
};

// English: Gopher's eight. The others are ours: very frequent function words
// of each language (as split_words cuts them), so that ordinary prose has
// several per paragraph.
const std::vector<StopList>& builtin_stop_lists() {
  static const std::vector<StopList> lists = {
      {"en", {"the", "be", "to", "of", "and", "that", "have", "with"}},
      {"de",
       {"der", "die", "das", "und", "ist", "zu", "den", "mit", "nicht", "von", "sich", "auf"}},
      {"fr", {"le", "la", "les", "de", "et", "un", "une", "est", "que", "des", "pour", "dans"}},
      {"es", {"el", "la", "de", "que", "y", "en", "los", "se", "del", "las", "por", "un"}},
      {"it", {"il", "di", "che", "e", "la", "per", "un", "in", "del", "non", "sono", "una"}},
      {"pt", {"o", "a", "de", "que", "e", "do", "da", "em", "um", "para", "com", "não"}},
      {"nl", {"de", "het", "een", "en", "van", "is", "dat", "op", "te", "in", "met", "niet"}},
      {"ru", {"и", "в", "не", "на", "что", "с", "он", "как", "по", "это", "к", "но"}},
      // ICU's dictionary keeps some pronoun compounds whole ("我的", "我们").
      {"zh", {"的", "了", "是", "在", "和", "有", "我们", "一个", "这个", "没有", "可以", "我的"}},
      {"ja", {"の", "に", "は", "を", "た", "が", "で", "て", "と", "し", "も", "な"}},
  };
  return lists;
}

// "en", "en-US", "en_US", "EN" -> "en".
std::string base_language(std::string s) {
  size_t cut = s.find_first_of("-_");
  if (cut != std::string::npos) s.resize(cut);
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Lowercases a short word into `buf`; false when it does not fit.
bool lower_into(std::string_view w, std::array<char, 64>& buf, size_t& len) {
  int32_t i = 0, o = 0;
  while (i < int32_t(w.size())) {
    UChar32 c;
    U8_NEXT(w.data(), i, int32_t(w.size()), c);
    if (c < 0) return false;
    c = u_tolower(c);
    if (o + U8_LENGTH(c) > int32_t(buf.size())) return false;
    U8_APPEND_UNSAFE(buf.data(), o, c);
  }
  len = size_t(o);
  return true;
}

}  // namespace

void StopWordsRule::read(StageConfig& c) {
  c.bind("min_stop_words", min_stop_words, "fewest stop words a kept document has");
  if (min_stop_words < 0) c.fail_key("min_stop_words", "must be >= 0");
  if (c.bind("stop_words", words, "the stop words (default: per language)") && words.empty())
    c.fail_key("stop_words", "must not be empty");
  for (std::string& w : words) {
    std::array<char, 64> buf;
    size_t len = 0;
    if (!lower_into(w, buf, len)) c.fail_key("stop_words", fmt::format("word too long: '{}'", w));
    w.assign(buf.data(), len);
  }
  c.bind("default_language", default_language,
         "stop words for documents without a language label (default none: such documents pass "
         "unchecked, counted as stop_words_no_language; set it only for a corpus in one language)");
  default_language = base_language(default_language);
}

// Occurrences count (datatrove: sum(w in stop_words for w in words)), compared
// case-insensitively. The list is `stop_words` if given, else the built-in list
// of doc.meta["language"] (default_language when absent); a language without a
// list passes and is counted as "stop_words_no_list"; a document with neither
// a label nor a default_language passes and is counted as
// "stop_words_no_language", with one warning per process.
Reason StopWordsRule::check(const Document& d, TextView& v, Counters& counts) const {
  std::vector<std::string_view> own;
  const std::vector<std::string_view>* list = nullptr;
  std::string lang;
  if (!words.empty()) {
    own.assign(words.begin(), words.end());
    list = &own;
  } else {
    auto it = d.meta.find("language");
    lang = it != d.meta.end() && it->is_string() ? base_language(it->get<std::string>())
                                                 : default_language;
    if (lang.empty()) {
      // A document without words has no stop words in any language.
      if (v.words().empty())
        return min_stop_words > 0 ? Reason(fmt::format("stop_words 0 < {}", min_stop_words))
                                  : Reason{};
      static std::once_flag warned;
      std::call_once(warned, [] {
        NK_WARN(
            "stop_words: documents without a language label are not checked (counted as "
            "stop_words_no_language); run language_id before this stage, or set "
            "default_language for a corpus in one language");
      });
      ++counts["stop_words_no_language"];
      return {};
    }
    for (const StopList& l : builtin_stop_lists())
      if (l.lang == lang) list = &l.words;
    if (!list) {
      ++counts["stop_words_no_list"];
      return {};
    }
  }
  size_t longest = 0;
  for (std::string_view s : *list) longest = std::max(longest, s.size());
  int64_t found = 0;
  std::array<char, 64> buf;
  for (std::string_view w : v.words()) {
    if (w.size() > longest * 2) continue;  // lowercasing never shrinks a word below half
    size_t len = 0;
    if (!lower_into(w, buf, len)) continue;
    std::string_view lw(buf.data(), len);
    for (std::string_view s : *list)
      if (s == lw) {
        if (++found >= min_stop_words) return {};
        break;
      }
  }
  if (found >= min_stop_words) return {};
  if (lang.empty()) return fmt::format("stop_words {} < {}", found, min_stop_words);
  return fmt::format("stop_words {} < {} ({})", found, min_stop_words, lang);
}

// ---- Gopher repetition -------------------------------------------------------------

void DuplicateLinesRule::read(StageConfig& c) {
  read_ratio(c, "dup_line_frac", max_frac, "most duplicated lines kept (of lines)");
  read_ratio(c, "dup_line_char_frac", max_char_frac,
             "most characters in duplicated lines kept (of characters)");
}

// Lines are compared trimmed and blank lines are left out (deviation: datatrove
// counts repeated blank lines as duplicates). Char fraction: code points of the
// duplicates (after each first occurrence) over all code points of the text.
Reason DuplicateLinesRule::check(const Document&, TextView& v, Counters&) const {
  if (v.words().empty()) return no_words("duplicate_lines");
  thread_local std::vector<std::string_view> lines;
  lines.clear();
  for (std::string_view l : v.lines())
    if (!(l = trim(l)).empty()) lines.push_back(l);
  DupStats s = find_duplicates(lines);
  double f = double(s.dups) / double(s.items);
  if (f > max_frac) return fmt::format("duplicate_lines {} > {}", ratio_str(f), max_frac);
  double cf = double(s.dup_chars) / double(v.chars());
  if (cf > max_char_frac)
    return fmt::format("duplicate_line_chars {} > {}", ratio_str(cf), max_char_frac);
  return {};
}

void DuplicateParagraphsRule::read(StageConfig& c) {
  read_ratio(c, "dup_para_frac", max_frac, "most duplicated paragraphs kept (of paragraphs)");
  read_ratio(c, "dup_para_char_frac", max_char_frac,
             "most characters in duplicated paragraphs kept (of characters)");
}

// Paragraphs are runs of non-blank lines split at blank lines (datatrove splits
// at "\n\n+"; a line of spaces between paragraphs is a break here as well).
Reason DuplicateParagraphsRule::check(const Document&, TextView& v, Counters&) const {
  if (v.words().empty()) return no_words("duplicate_paragraphs");
  thread_local std::vector<std::string_view> paras;
  paras.clear();
  const char* start = nullptr;
  const char* end = nullptr;
  for (std::string_view l : v.lines()) {
    if (trim(l).empty()) {
      if (start) paras.push_back(trim(std::string_view(start, size_t(end - start))));
      start = nullptr;
      continue;
    }
    if (!start) start = l.data();
    end = l.data() + l.size();
  }
  if (start) paras.push_back(trim(std::string_view(start, size_t(end - start))));
  DupStats s = find_duplicates(paras);
  double f = double(s.dups) / double(s.items);
  if (f > max_frac) return fmt::format("duplicate_paragraphs {} > {}", ratio_str(f), max_frac);
  double cf = double(s.dup_chars) / double(v.chars());
  if (cf > max_char_frac)
    return fmt::format("duplicate_paragraph_chars {} > {}", ratio_str(cf), max_char_frac);
  return {};
}

void TopNgramsRule::read(StageConfig& c) {
  read_ngram_limits(c, "top_n_grams", limits, "per n: most characters the top n-gram covers, kept");
}

// The most frequent word n-gram (ties: the one that occurs first) and the
// characters its occurrences cover, counted once where they overlap, over all
// code points. Deviation: an n-gram seen once is not a repetition, so the rule
// only looks at n-grams that occur at least twice (datatrove also scores a
// short document's single n-grams).
Reason TopNgramsRule::check(const Document&, TextView& v, Counters&) const {
  if (v.words().empty()) return no_words("top_ngrams");
  const auto& wh = v.word_hashes();
  const auto& wc = v.word_chars();
  thread_local std::vector<uint64_t> grams;
  for (const auto& [n, limit] : limits) {
    ngram_hashes(wh, size_t(n), grams);
    if (grams.empty()) continue;
    HashCounter& cnt = counter();
    cnt.reset(grams.size());
    uint32_t best = 0;
    uint64_t top = 0;
    for (uint64_t g : grams) best = std::max(best, cnt.add(g));
    if (best < 2) continue;
    for (uint64_t g : grams)  // ties: the n-gram that occurs first
      if (cnt.count(g) == best) {
        top = g;
        break;
      }
    Coverage cov(wc, size_t(n));
    for (size_t i = 0; i < grams.size(); ++i)
      if (grams[i] == top) cov.add(i);
    double r = double(cov.chars()) / double(v.chars());
    if (r > limit) return fmt::format("top_{}gram_chars {} > {}", n, ratio_str(r), limit);
  }
  return {};
}

void DuplicateNgramsRule::read(StageConfig& c) {
  read_ngram_limits(c, "dup_n_grams", limits, "per n: most characters in repeated n-grams, kept");
}

// Characters in word n-grams that repeat an earlier n-gram, each character
// counted once, over all code points (Gopher; datatrove skips n words after a
// repeat instead of taking the union, which counts slightly fewer).
Reason DuplicateNgramsRule::check(const Document&, TextView& v, Counters&) const {
  if (v.words().empty()) return no_words("duplicate_ngrams");
  const auto& wh = v.word_hashes();
  const auto& wc = v.word_chars();
  thread_local std::vector<uint64_t> grams;
  for (const auto& [n, limit] : limits) {
    ngram_hashes(wh, size_t(n), grams);
    if (grams.empty()) continue;
    HashCounter& cnt = counter();
    cnt.reset(grams.size());
    Coverage cov(wc, size_t(n));
    for (size_t i = 0; i < grams.size(); ++i)
      if (cnt.add(grams[i]) > 1) cov.add(i);
    double r = double(cov.chars()) / double(v.chars());
    if (r > limit) return fmt::format("duplicate_{}gram_chars {} > {}", n, ratio_str(r), limit);
  }
  return {};
}

}  // namespace nk::curate
