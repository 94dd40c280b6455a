// Word splitting for any script. Space-separated scripts split at anything
// that is not a letter, mark or digit (an apostrophe between letters stays
// inside: "don't"); runs of Han, Hiragana, Katakana, Thai, Lao, Khmer and
// Myanmar, which are written without spaces, go through ICU's dictionary-based
// word break iterator. Punctuation and symbols are never words.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace nk::curate {

// Appends the words of `text` (valid UTF-8) to `out` as views into it, in order.
void split_words(std::string_view text, std::vector<std::string_view>& out);

// Convenience: the words of `text` in a new vector.
std::vector<std::string_view> words_of(std::string_view text);

// Number of code points in a valid UTF-8 string.
size_t utf8_length(std::string_view s);

// The code point at s[i], advancing i past it (tolerant of a sequence cut off
// at the end of `s`).
char32_t next_code_point(std::string_view s, size_t& i);
// Appends `cp` to `out` as UTF-8.
void append_utf8(char32_t cp, std::string& out);
// Han, Hiragana, Katakana, Thai, Lao, Khmer, Myanmar (and the Japanese
// prolonged-sound and iteration marks): scripts written without spaces.
bool is_unspaced_script(char32_t cp);

}  // namespace nk::curate
