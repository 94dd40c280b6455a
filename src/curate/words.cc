#include "curate/words.h"

#include <unicode/brkiter.h>
#include <unicode/uchar.h>
#include <unicode/uscript.h>
#include <unicode/utext.h>

#include <memory>

#include "core/error.h"

namespace nk::curate {

namespace {

enum class Kind { Space, Word, Dense };  // Dense: a script written without spaces

inline bool is_word_char(UChar32 cp) {
  uint32_t mask = U_GET_GC_MASK(cp);
  return (mask & (U_GC_L_MASK | U_GC_M_MASK | U_GC_N_MASK)) != 0;
}

Kind kind_of(UChar32 cp) {
  if (cp < 0x80) {
    bool w = (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9');
    return w ? Kind::Word : Kind::Space;
  }
  // Unspaced scripts, with the prolonged sound and iteration marks, form dense runs.
  if (is_unspaced_script(char32_t(cp))) return Kind::Dense;
  return is_word_char(cp) ? Kind::Word : Kind::Space;
}

inline bool is_apostrophe(UChar32 cp) {
  return cp == '\'' || cp == 0x2019;
}

// ICU's word break iterator over one dense run; thread-local, created once.
void split_dense(std::string_view run, std::vector<std::string_view>& out) {
  thread_local std::unique_ptr<icu::BreakIterator> it = [] {
    UErrorCode err = U_ZERO_ERROR;
    std::unique_ptr<icu::BreakIterator> b(
        icu::BreakIterator::createWordInstance(icu::Locale::getRoot(), err));
    if (U_FAILURE(err) || !b)
      fail("ICU: cannot create a word break iterator: {}", u_errorName(err));
    return b;
  }();
  UErrorCode err = U_ZERO_ERROR;
  UText* ut = utext_openUTF8(nullptr, run.data(), int64_t(run.size()), &err);
  if (U_FAILURE(err)) fail("ICU: cannot open text: {}", u_errorName(err));
  it->setText(ut, err);
  int32_t start = it->first();
  for (int32_t end = it->next(); end != icu::BreakIterator::DONE; start = end, end = it->next()) {
    if (it->getRuleStatus() == UBRK_WORD_NONE) continue;  // spaces, punctuation
    out.push_back(run.substr(size_t(start), size_t(end - start)));
  }
  utext_close(ut);
}

}  // namespace

void split_words(std::string_view text, std::vector<std::string_view>& out) {
  size_t i = 0, n = text.size();
  while (i < n) {
    size_t start = i;
    UChar32 cp = next_code_point(text, i);
    Kind k = kind_of(cp);
    if (k == Kind::Space) continue;
    if (k == Kind::Word) {
      size_t end = i;
      while (i < n) {
        size_t j = i;
        UChar32 c = next_code_point(text, j);
        Kind kc = kind_of(c);
        if (kc == Kind::Word) {
          i = end = j;
          continue;
        }
        if (is_apostrophe(c) && j < n) {  // inside a word: "don't", "l'homme"
          size_t j2 = j;
          if (kind_of(next_code_point(text, j2)) == Kind::Word) {
            i = end = j2;
            continue;
          }
        }
        break;
      }
      out.push_back(text.substr(start, end - start));
      continue;
    }
    // A dense run: up to the next character of another kind (marks included).
    size_t end = i;
    while (i < n) {
      size_t j = i;
      UChar32 c = next_code_point(text, j);
      Kind kc = kind_of(c);
      bool mark = c >= 0x80 && (U_GET_GC_MASK(c) & U_GC_M_MASK) != 0;
      if (kc != Kind::Dense && !mark) break;
      i = end = j;
    }
    split_dense(text.substr(start, end - start), out);
  }
}

std::vector<std::string_view> words_of(std::string_view text) {
  std::vector<std::string_view> w;
  split_words(text, w);
  return w;
}

char32_t next_code_point(std::string_view s, size_t& i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
  char32_t cp = n == 1 ? c : c & (0x3F >> (n - 1));
  size_t k = 1;
  for (; k < size_t(n) && i + k < s.size(); ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
  i += k;
  return cp;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

bool is_unspaced_script(char32_t cp) {
  if (cp == 0x30FC || cp == 0x3005) return true;
  if (cp < 0x0E00) return false;
  UErrorCode err = U_ZERO_ERROR;
  switch (uscript_getScript(UChar32(cp), &err)) {
    case USCRIPT_HAN:
    case USCRIPT_HIRAGANA:
    case USCRIPT_KATAKANA:
    case USCRIPT_THAI:
    case USCRIPT_LAO:
    case USCRIPT_KHMER:
    case USCRIPT_MYANMAR:
      return true;
    default:
      return false;
  }
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace nk::curate
