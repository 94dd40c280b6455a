// Text cleaning: the `clean` stage and the rules it is made of, each usable on
// its own. Every rule takes valid UTF-8 and leaves valid UTF-8; none allocates
// per character, and all are linear in the text.
//
// The stage applies them in this order (each can be switched off):
//   fix_mojibake → control_chars → nfc → whitespace → repeated_lines →
//   boilerplate_lines
// Mojibake goes first because its repair needs the C1 characters that
// control_chars would delete.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "curate/document.h"

namespace nk::curate {

// Unicode NFC (ICU). ASCII and already-normalised text come back unchanged.
std::string nfc(std::string_view text);

// Repairs UTF-8 that was decoded as Windows-1252 (or Latin-1) and encoded
// again: "CafÃ©" → "Café", "â€™" → "’", "ÐŸÑ€Ð¸Ð²ÐµÑ‚" → "Привет", applied twice
// → repaired twice. A run of characters is replaced only when their
// cp1252 bytes form one valid UTF-8 character and the result is plausible: a
// 3- or 4-byte character; a 2-byte one in U+00A0..U+017F (Latin-1 and
// Latin Extended-A letters and symbols); a combining mark after a letter; or
// any other 2-byte character next to another repair (a word of Cyrillic or
// Greek) or in a text with at least two other repairs. Correct text such as
// "SÃO", "Ärger" or "groß“" is left alone. Returns the number of characters
// repaired.
size_t fix_mojibake(std::string& text);

// Removes C0 controls and DEL (keeping \t \n \r \f \v, which are whitespace
// for normalize_whitespace), C1 controls U+0080..U+009F, and invisible
// junk: zero width space U+200B, word joiner U+2060, BOM U+FEFF and soft
// hyphen U+00AD. ZWJ/ZWNJ (needed by emoji, Indic and Persian text) and
// bidi marks stay. Returns the number of characters removed.
size_t remove_control_chars(std::string& text);

// \r\n and \r → \n; \f, \v and Unicode space separators (U+00A0, U+1680,
// U+2000..U+200A, U+202F, U+205F) → ' '; inside a line a run of spaces
// becomes one (a line's leading indentation and tabs are kept: code);
// line ends are trimmed; at most one blank line in a row; the document is
// trimmed. U+3000 (ideographic space) is kept: it is part of CJK layout.
// Returns whether anything changed.
bool normalize_whitespace(std::string& text);

// Drops every repeat of a line after its first occurrence (lines compared
// exactly; empty lines, and lines shorter than `min_bytes`, are never
// dropped). Returns the number of lines dropped.
size_t remove_repeated_lines(std::string& text, size_t min_bytes = 1);

// Drops lines of at most `max_words` whitespace-separated words that contain
// one of `phrases` (matched ignoring ASCII case, at word boundaries).
// Returns the number of lines dropped.
size_t remove_boilerplate_lines(std::string& text, const std::vector<std::string>& phrases,
                                int max_words);

// "all rights reserved", "cookie", "privacy policy", "sign in", ...
const std::vector<std::string>& default_boilerplate_phrases();

struct CleanOptions {
  bool nfc = true;
  bool fix_mojibake = true;
  bool control_chars = true;
  bool whitespace = true;
  bool repeated_lines = true;
  size_t repeated_min_chars = 1;  // in bytes: shorter lines are never "repeats"
  bool boilerplate_lines = true;
  int boilerplate_max_words = 10;
  std::vector<std::string> boilerplate_phrases = default_boilerplate_phrases();
};

// All enabled rules, in the order above. Counts "mojibake_fixed",
// "control_chars_removed", "nfc_changed", "whitespace_changed",
// "lines_removed_repeated", "lines_removed_boilerplate".
void clean_text(std::string& text, const CleanOptions& opt, Counters& counts);

}  // namespace nk::curate
