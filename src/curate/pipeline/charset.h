// The character set of a web page, and its text transcoded to UTF-8.
//
// Where the charset comes from, in order (WHATWG's "encoding sniffing", minus
// the browser-only steps): a byte-order mark; the charset parameter of the
// HTTP Content-Type header; a <meta charset=...> or <meta http-equiv=
// "Content-Type" content="...; charset=..."> in the page's first
// kMetaScanBytes (HTML only); then detection: valid UTF-8 is UTF-8, anything
// else is what Debian's libuchardet names. Labels are resolved as WHATWG's
// Encoding Standard does (iso-8859-1 and us-ascii are windows-1252, gb2312
// and gbk are gb18030, shift_jis is windows-31j, ...) and the bytes are
// transcoded with ICU.
//
// A declared charset that ICU does not know, or that the bytes are not valid
// in (a page declared Shift_JIS that holds bytes Shift_JIS cannot have), is
// passed over for the next source; so is a declared legacy charset when the
// bytes are valid UTF-8 with non-ASCII characters (the common mislabelled page:
// legacy text is essentially never valid UTF-8). Bytes that no candidate
// decodes cleanly are decoded with the first declared charset ICU knows (else
// the detected one, else windows-1252) and each undecodable sequence becomes
// U+FFFD; the result says so (`lossy`). A multi-byte character cut off at the
// very end (a crawler's truncated page) is dropped, not counted as lossy.
#pragma once
#include <string>
#include <string_view>

namespace nk::curate {

// Bytes of an HTML page searched for a <meta> charset declaration.
inline constexpr size_t kMetaScanBytes = 4096;

enum class CharsetFrom { Bom, Header, Meta, Detected, Default };
// "bom", "header", "meta", "detected", "default" (nothing declared or detected:
// windows-1252).
const char* charset_from_name(CharsetFrom f);

struct DecodedText {
  std::string text;     // valid UTF-8, without a byte-order mark
  std::string charset;  // the charset used, as ICU's canonical name's label: "windows-1251"
  CharsetFrom from = CharsetFrom::Default;
  bool declared_unusable = false;  // a declared charset was unknown, or wrong for the bytes
  bool lossy = false;              // undecodable bytes became U+FFFD
};

// `header_charset`: the charset parameter of the HTTP (or WARC) Content-Type,
// "" when there is none. `html`: also look for a <meta> declaration.
DecodedText decode_to_utf8(std::string_view bytes, std::string_view header_charset, bool html);

// The charset parameter of a Content-Type value ("text/html; charset=\"UTF-8\""
// gives "UTF-8"), or "".
std::string charset_param(std::string_view content_type);

// The charset a <meta> tag in the first `scan` bytes declares, or "".
std::string meta_charset(std::string_view html, size_t scan = kMetaScanBytes);

// The charset libuchardet detects (its name, e.g. "WINDOWS-1251"), or "" when
// it is not sure. Pure ASCII gives "ASCII".
std::string detect_charset(std::string_view bytes);

// The ICU converter name a charset label resolves to under WHATWG's rules
// ("latin1" -> "windows-1252", "gbk" -> "gb18030"), or "" when the label is
// not one ICU can decode (or one WHATWG forbids, such as UTF-7).
std::string resolve_charset(std::string_view label);

}  // namespace nk::curate
