// UTF-8 validation and repair shared by the corpus readers and the tokenizers.
// "Invalid" means what the Unicode standard and WHATWG's decoder reject:
// stray continuation bytes, truncated sequences, overlong forms, UTF-16
// surrogates (U+D800..DFFF) and code points above U+10FFFF.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace nk {

// Offset of the first byte of the first invalid UTF-8 sequence, or -1 if `s`
// is valid.
int64_t find_invalid_utf8(std::string_view s);

// Appends `s` to `out` with each maximal subpart of an ill-formed sequence
// replaced by one U+FFFD (EF BF BD): the "best practice" of Unicode ch. 3 that
// WHATWG's decoder (Node's Buffer.toString, TextDecoder) and Python's
// errors="replace" follow. E.g. "\xE2\x82A" gives U+FFFD 'A' and "\xC0\xAF"
// gives two U+FFFD. Returns the number of U+FFFD inserted (0: `s` was valid).
int64_t append_replacing_invalid_utf8(std::string_view s, std::string& out);

// As above, into a new string.
std::string replace_invalid_utf8(std::string_view s, int64_t* replaced = nullptr);

// `s` with each byte of an ill-formed sequence written as \xHH, as Python's
// errors="backslashreplace" does: how a file name that is not UTF-8 appears
// in document ids, reports and messages (valid UTF-8, and readable).
std::string escape_invalid_utf8(std::string_view s);

// Length in bytes of the well-formed sequence starting at p[0] (1..4), or
// minus the length of the maximal ill-formed subpart there (-1..-3). n >= 1 is
// the number of bytes available.
int utf8_sequence_length(const unsigned char* p, size_t n);

}  // namespace nk
