// C4's line-level cleaning.
//
// Source: Raffel et al. 2020 (JMLR 21), section 2.2, and datatrove's
// C4QualityFilter, whose key names and defaults we take: min_num_sentences 5,
// min_words_per_line 3, max_word_length 1000 (the original TFDS c4_utils uses
// 3 sentences and 5 words per line; both are keys). Per line, in this order:
// drop it if a word is longer than max_word_length; strip Wikipedia citations
// ([1], [edit], [citation needed]); drop it unless it ends in terminal
// punctuation (and not in "..."); drop it if it has fewer than
// min_words_per_line words; remove the document on "lorem ipsum"; drop the line
// on "javascript"; remove the document on "{"; drop the line on a policy
// phrase. The document goes if its kept lines hold fewer than
// min_num_sentences sentences; otherwise its text becomes the kept lines.
// Words are split_words (so Chinese lines are not one "word"); sentences are
// ICU's sentence breaks (C4 used NLTK's punkt).
#include <fmt/format.h>
#include <unicode/brkiter.h>
#include <unicode/utext.h>

#include <array>
#include <memory>

#include "core/error.h"
#include "curate/filters/filters.h"
#include "curate/words.h"

namespace nk::curate {

namespace {

// TFDS c4_utils / datatrove POLICY_SUBSTRINGS.
constexpr std::array<std::string_view, 6> kPolicy = {"terms of use",   "privacy policy",
                                                     "cookie policy",  "uses cookies",
                                                     "use of cookies", "use cookies"};

std::string_view trim(std::string_view s) {
  auto sp = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; };
  while (!s.empty() && sp(s.front())) s.remove_prefix(1);
  while (!s.empty() && sp(s.back())) s.remove_suffix(1);
  return s;
}

// Removes [123], [], [edit] and [citation needed] (C4's CITATION_REGEX).
std::string_view strip_citations(std::string_view line, std::string& buf) {
  if (line.find('[') == std::string_view::npos) return line;
  buf.clear();
  size_t i = 0;
  while (i < line.size()) {
    if (line[i] == '[') {
      size_t j = i + 1;
      while (j < line.size() && line[j] >= '0' && line[j] <= '9') ++j;
      size_t skip = 0;
      if (j < line.size() && line[j] == ']')
        skip = j + 1 - i;
      else if (line.substr(i).starts_with("[edit]"))
        skip = 6;
      else if (line.substr(i).starts_with("[citation needed]"))
        skip = 17;
      if (skip) {
        i += skip;
        continue;
      }
    }
    buf.push_back(line[i++]);
  }
  return buf;
}

size_t count_sentences(std::string_view line) {
  thread_local std::unique_ptr<icu::BreakIterator> it = [] {
    UErrorCode err = U_ZERO_ERROR;
    std::unique_ptr<icu::BreakIterator> b(
        icu::BreakIterator::createSentenceInstance(icu::Locale::getRoot(), err));
    if (U_FAILURE(err) || !b)
      fail("ICU: cannot create a sentence break iterator: {}", u_errorName(err));
    return b;
  }();
  UErrorCode err = U_ZERO_ERROR;
  UText* ut = utext_openUTF8(nullptr, line.data(), int64_t(line.size()), &err);
  if (U_FAILURE(err)) fail("ICU: cannot open text: {}", u_errorName(err));
  it->setText(ut, err);
  size_t n = 0;
  it->first();
  while (it->next() != icu::BreakIterator::DONE) ++n;
  utext_close(ut);
  return n;
}

class C4Stage final : public DocStage {
 public:
  explicit C4Stage(StageConfig& c) {
    c.bind("remove_citations", remove_citations_, "strip Wikipedia citations ([1], [edit])");
    c.bind("filter_no_terminal_punct", filter_no_terminal_punct_,
           "drop lines not ending in terminal punctuation");
    c.bind("min_num_sentences", min_num_sentences_, "fewest sentences a kept document has");
    c.bind("min_words_per_line", min_words_per_line_, "drop lines with fewer words");
    c.bind("max_word_length", max_word_length_, "drop lines with a longer word (code points)");
    c.bind("filter_lorem_ipsum", filter_lorem_ipsum_, "remove documents with 'lorem ipsum'");
    c.bind("filter_javascript", filter_javascript_, "drop lines mentioning javascript");
    c.bind("filter_curly_bracket", filter_curly_bracket_, "remove documents with a '{'");
    c.bind("filter_policy", filter_policy_, "drop lines with a policy or cookie phrase");
    // -1 disables a count rule, as in datatrove.
    auto at_least_minus_one = [&](const char* key, int64_t v) {
      if (v < -1) c.fail_key(key, fmt::format("must be >= 0, or -1 to disable, got {}", v));
    };
    at_least_minus_one("min_num_sentences", min_num_sentences_);
    at_least_minus_one("min_words_per_line", min_words_per_line_);
    at_least_minus_one("max_word_length", max_word_length_);
  }

  Verdict apply(Document& doc, Counters& counts) const override {
    thread_local std::string out, cite_buf;
    thread_local std::vector<std::string_view> words;
    out.clear();
    int64_t sentences = 0;
    std::array<int64_t, 5> dropped{};  // long word, no punctuation, few words, javascript, policy
    std::string_view text = doc.text;
    size_t start = 0;
    while (start <= text.size()) {
      size_t nl = text.find('\n', start);
      if (nl == std::string_view::npos) nl = text.size();
      std::string_view line = trim(text.substr(start, nl - start));
      start = nl + 1;
      if (line.empty()) continue;
      words.clear();
      split_words(line, words);
      if (max_word_length_ >= 0 && has_long_word(words)) {
        ++dropped[0];
        continue;
      }
      if (remove_citations_) line = strip_citations(line, cite_buf);
      if (filter_no_terminal_punct_ &&
          (!ends_in_terminal_punctuation(line) || line.ends_with("..."))) {
        ++dropped[1];
        continue;
      }
      if (int64_t(words.size()) < min_words_per_line_) {
        ++dropped[2];
        continue;
      }
      if (filter_lorem_ipsum_ && contains_ascii_ci(line, "lorem ipsum"))
        return Verdict::removed("c4: lorem ipsum");
      if (filter_javascript_ && contains_ascii_ci(line, "javascript")) {
        ++dropped[3];
        continue;
      }
      if (filter_curly_bracket_ && line.find('{') != std::string_view::npos)
        return Verdict::removed("c4: curly bracket");
      if (filter_policy_ && has_policy(line)) {
        ++dropped[4];
        continue;
      }
      if (min_num_sentences_ > 0 && sentences < min_num_sentences_)
        sentences += int64_t(count_sentences(line));
      if (!out.empty()) out.push_back('\n');
      out.append(line);
    }
    static constexpr std::array<const char*, 5> kNames = {
        "c4_lines_long_word", "c4_lines_no_terminal_punct", "c4_lines_few_words",
        "c4_lines_javascript", "c4_lines_policy"};
    for (size_t i = 0; i < dropped.size(); ++i)
      if (dropped[i]) counts[kNames[i]] += dropped[i];
    if (sentences < min_num_sentences_)
      return Verdict::removed(fmt::format("c4: sentences {} < {}", sentences, min_num_sentences_));
    if (out.empty()) return Verdict::removed("c4: no lines left");
    doc.text = out;
    return Verdict::kept();
  }

 private:
  bool has_long_word(const std::vector<std::string_view>& words) const {
    for (std::string_view w : words)
      if (int64_t(w.size()) > max_word_length_ && int64_t(utf8_length(w)) > max_word_length_)
        return true;
    return false;
  }
  static bool has_policy(std::string_view line) {
    for (std::string_view p : kPolicy)
      if (contains_ascii_ci(line, p)) return true;
    return false;
  }

  bool remove_citations_ = true, filter_no_terminal_punct_ = true, filter_lorem_ipsum_ = true,
       filter_javascript_ = true, filter_curly_bracket_ = true, filter_policy_ = true;
  int64_t min_num_sentences_ = 5, min_words_per_line_ = 3, max_word_length_ = 1000;
};

}  // namespace

std::unique_ptr<DocStage> make_c4_stage(StageConfig& c) {
  return std::make_unique<C4Stage>(c);
}

}  // namespace nk::curate
