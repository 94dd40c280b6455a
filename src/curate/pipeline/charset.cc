#include "curate/pipeline/charset.h"

#include <uchardet/uchardet.h>
#include <unicode/uchar.h>
#include <unicode/ucnv.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <unordered_map>

#include "data/utf8.h"

namespace nk::curate {

const char* charset_from_name(CharsetFrom f) {
  switch (f) {
    case CharsetFrom::Bom:
      return "bom";
    case CharsetFrom::Header:
      return "header";
    case CharsetFrom::Meta:
      return "meta";
    case CharsetFrom::Detected:
      return "detected";
    case CharsetFrom::Default:
      return "default";
  }
  return "?";
}

namespace {

char lower(char c) {
  return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
}

bool space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

std::string trim_label(std::string_view s) {
  while (!s.empty() && (space(s.front()) || s.front() == '"' || s.front() == '\''))
    s.remove_prefix(1);
  while (!s.empty() && (space(s.back()) || s.back() == '"' || s.back() == '\'')) s.remove_suffix(1);
  std::string out(s);
  for (char& c : out) c = lower(c);
  return out;
}

// WHATWG Encoding Standard labels whose decoder is not the one ICU gives the
// same name (or that ICU does not know): label -> the name ICU decodes it by.
const std::unordered_map<std::string, std::string>& whatwg_labels() {
  static const auto* m = [] {
    auto* t = new std::unordered_map<std::string, std::string>;
    auto add = [&](const char* name, std::initializer_list<const char*> labels) {
      for (const char* l : labels) (*t)[l] = name;
    };
    add("windows-1252",
        {"ansi_x3.4-1968", "ascii", "cp1252", "cp819", "csisolatin1", "ibm819", "iso-8859-1",
         "iso-ir-100", "iso8859-1", "iso88591", "iso_8859-1", "iso_8859-1:1987", "l1", "latin1",
         "us-ascii", "windows-1252", "x-cp1252"});
    add("windows-1254",
        {"cp1254", "csisolatin5", "iso-8859-9", "iso-ir-148", "iso8859-9", "iso88599", "iso_8859-9",
         "iso_8859-9:1989", "l5", "latin5", "windows-1254", "x-cp1254"});
    add("windows-874",
        {"dos-874", "iso-8859-11", "iso8859-11", "iso885911", "tis-620", "windows-874"});
    add("gb18030", {"chinese", "csgb2312", "csiso58gb231280", "gb2312", "gb_2312", "gb_2312-80",
                    "gbk", "iso-ir-58", "x-gbk", "gb18030", "cp936", "ms936", "windows-936"});
    add("windows-31j", {"csshiftjis", "ms932", "ms_kanji", "shift-jis", "shift_jis", "sjis",
                        "windows-31j", "x-sjis", "cp932"});
    add("windows-949",
        {"cseuckr", "csksc56011987", "euc-kr", "iso-ir-149", "korean", "ks_c_5601-1987",
         "ks_c_5601-1989", "ksc5601", "ksc_5601", "windows-949", "cp949"});
    add("big5-hkscs", {"big5", "big5-hkscs", "cn-big5", "csbig5", "x-x-big5"});
    add("utf-16le",
        {"csunicode", "iso-10646-ucs-2", "ucs-2", "unicode", "unicodefeff", "utf-16", "utf-16le"});
    add("utf-16be", {"unicodefffe", "utf-16be"});
    add("utf-8", {"unicode-1-1-utf-8", "unicode11utf8", "unicode20utf8", "utf-8", "utf8",
                  "x-unicode20utf8"});
    return t;
  }();
  return *m;
}

struct ConverterDeleter {
  void operator()(UConverter* c) const { ucnv_close(c); }
};

struct Converter {
  std::unique_ptr<UConverter, ConverterDeleter> cnv;  // null: ICU does not know the name
  bool ascii_compatible = false;  // bytes 0..127 decode to U+0000..U+007F, one for one
};

Converter& converter(const std::string& name) {
  thread_local std::unordered_map<std::string, Converter> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  if (cache.size() > 256) cache.clear();  // labels from the web are open-ended
  Converter& c = cache[name];
  UErrorCode e = U_ZERO_ERROR;
  if (name.empty()) return c;  // ucnv_open("") is the platform default: never wanted
  UConverter* u = ucnv_open(name.c_str(), &e);
  if (U_FAILURE(e) || !u) return c;
  c.cnv.reset(u);
  const char* canon = ucnv_getName(u, &e);
  // UTF-7 (and its kin) read '+' as an escape: WHATWG forbids them in pages.
  if (U_FAILURE(e) || std::strstr(canon, "UTF-7") || std::strstr(canon, "BOCU") ||
      std::strstr(canon, "SCSU") || std::strstr(canon, "IMAP")) {
    c.cnv.reset();
    return c;
  }
  char ascii[128];
  for (int i = 0; i < 128; ++i) ascii[i] = char(i);
  UChar out[256];
  const char* src = ascii;
  UChar* tgt = out;
  e = U_ZERO_ERROR;
  ucnv_setToUCallBack(u, UCNV_TO_U_CALLBACK_STOP, nullptr, nullptr, nullptr, &e);
  ucnv_toUnicode(u, &tgt, out + 256, &src, ascii + 128, nullptr, true, &e);
  c.ascii_compatible = U_SUCCESS(e) && tgt - out == 128;
  for (int i = 0; c.ascii_compatible && i < 128; ++i) c.ascii_compatible = out[i] == UChar(i);
  ucnv_reset(u);
  return c;
}

// `bytes` decoded by `name` into UTF-8. Strict: false at the first sequence
// the charset cannot decode. Otherwise each such sequence becomes U+FFFD,
// counted in `replaced`. An incomplete character at the very end is dropped.
bool transcode(std::string_view bytes, const std::string& name, bool strict, std::string& out,
               int64_t& replaced) {
  Converter& c = converter(name);
  if (!c.cnv) return false;
  UConverter* u = c.cnv.get();
  ucnv_reset(u);
  UErrorCode e = U_ZERO_ERROR;
  ucnv_setToUCallBack(u, UCNV_TO_U_CALLBACK_STOP, nullptr, nullptr, nullptr, &e);
  std::u16string wide(bytes.size() + 16, u'\0');
  const char* src = bytes.data();
  const char* end = bytes.data() + bytes.size();
  size_t done = 0;  // UTF-16 units written
  replaced = 0;
  for (;;) {
    UChar* tgt = reinterpret_cast<UChar*>(wide.data()) + done;
    UChar* tgt_end = reinterpret_cast<UChar*>(wide.data()) + wide.size();
    e = U_ZERO_ERROR;
    ucnv_toUnicode(u, &tgt, tgt_end, &src, end, nullptr, true, &e);
    done = size_t(tgt - reinterpret_cast<UChar*>(wide.data()));
    if (e == U_BUFFER_OVERFLOW_ERROR) {
      wide.resize(wide.size() * 2);
      continue;
    }
    if (e == U_TRUNCATED_CHAR_FOUND || U_SUCCESS(e)) break;
    // An illegal or unmapped sequence: the converter stopped just after it.
    if (strict) return false;
    if (done + 1 >= wide.size()) wide.resize(wide.size() * 2);
    wide[done++] = u'\uFFFD';
    ++replaced;
    if (src >= end) break;
  }
  ucnv_reset(u);
  out.resize(done * 3 + 1);
  int32_t len = 0, subs = 0;
  e = U_ZERO_ERROR;
  u_strToUTF8WithSub(out.data(), int32_t(out.size()), &len,
                     reinterpret_cast<const UChar*>(wide.data()), int32_t(done), 0xFFFD, &subs, &e);
  if (U_FAILURE(e)) return false;
  out.resize(size_t(len));
  replaced += subs;
  return true;
}

// Valid UTF-8, allowing an incomplete sequence at the very end; `keep` is
// the length without it.
bool valid_utf8(std::string_view s, size_t& keep) {
  int64_t bad = find_invalid_utf8(s);
  keep = s.size();
  if (bad < 0) return true;
  size_t rest = s.size() - size_t(bad);
  if (rest > 3) return false;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + bad;
  // Truncated: the maximal ill-formed subpart runs to the end and the byte
  // starts a multi-byte sequence.
  if (p[0] < 0xC2 || -utf8_sequence_length(p, rest) != int(rest)) return false;
  keep = size_t(bad);
  return true;
}

bool has_non_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return true;
  return false;
}

// Letters among the non-ASCII characters of `utf8`: how plausible a decoding is.
int64_t non_ascii_letters(std::string_view utf8) {
  int64_t n = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(utf8.data());
  size_t i = 0;
  while (i < utf8.size()) {
    int len = utf8_sequence_length(p + i, utf8.size() - i);
    if (len <= 0) {
      i += size_t(-len);
      continue;
    }
    if (len > 1) {
      UChar32 cp = 0;
      if (len == 2) cp = ((p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F);
      if (len == 3) cp = ((p[i] & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
      if (len == 4)
        cp = ((p[i] & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12) | ((p[i + 2] & 0x3F) << 6) |
             (p[i + 3] & 0x3F);
      if (u_isalpha(cp)) ++n;
    }
    i += size_t(len);
  }
  return n;
}

}  // namespace

std::string resolve_charset(std::string_view label) {
  std::string l = trim_label(label);
  if (l.empty()) return {};
  auto it = whatwg_labels().find(l);
  if (it != whatwg_labels().end()) l = it->second;
  return converter(l).cnv ? l : std::string();
}

std::string charset_param(std::string_view ct) {
  size_t pos = ct.find(';');
  while (pos != std::string_view::npos) {
    ++pos;
    while (pos < ct.size() && space(ct[pos])) ++pos;
    size_t eq = ct.find('=', pos);
    if (eq == std::string_view::npos) return {};
    std::string key = trim_label(ct.substr(pos, eq - pos));
    size_t v = eq + 1;
    while (v < ct.size() && space(ct[v])) ++v;
    size_t vend;
    if (v < ct.size() && (ct[v] == '"' || ct[v] == '\'')) {
      vend = ct.find(ct[v], v + 1);
      if (vend == std::string_view::npos) vend = ct.size();
      ++v;
    } else {
      vend = ct.find(';', v);
      if (vend == std::string_view::npos) vend = ct.size();
    }
    if (key == "charset") return trim_label(ct.substr(v, vend - v));
    pos = ct.find(';', vend);
  }
  return {};
}

namespace {

// WHATWG's "extracting a character encoding from a meta element": after
// "charset", optional spaces, '=', a quoted or bare value.
std::string charset_in_content(std::string_view c) {
  size_t i = 0;
  for (;;) {
    size_t k = std::string_view::npos;
    for (size_t j = i; j + 7 <= c.size(); ++j) {
      bool m = true;
      for (size_t t = 0; t < 7 && m; ++t) m = lower(c[j + t]) == "charset"[t];
      if (m) {
        k = j;
        break;
      }
    }
    if (k == std::string_view::npos) return {};
    size_t p = k + 7;
    while (p < c.size() && space(c[p])) ++p;
    if (p >= c.size() || c[p] != '=') {
      i = k + 7;
      continue;
    }
    ++p;
    while (p < c.size() && space(c[p])) ++p;
    if (p >= c.size()) return {};
    if (c[p] == '"' || c[p] == '\'') {
      size_t q = c.find(c[p], p + 1);
      if (q == std::string_view::npos) return {};
      return trim_label(c.substr(p + 1, q - p - 1));
    }
    size_t q = p;
    while (q < c.size() && !space(c[q]) && c[q] != ';') ++q;
    return trim_label(c.substr(p, q - p));
  }
}

}  // namespace

std::string meta_charset(std::string_view html, size_t scan) {
  std::string_view s = html.substr(0, std::min(scan, html.size()));
  size_t i = 0;
  while (i < s.size()) {
    size_t lt = s.find('<', i);
    if (lt == std::string_view::npos) return {};
    if (s.compare(lt, 4, "<!--") == 0) {  // comments are skipped
      size_t e = s.find("-->", lt + 4);
      if (e == std::string_view::npos) return {};
      i = e + 3;
      continue;
    }
    i = lt + 1;
    if (lt + 6 > s.size()) return {};
    bool is_meta = true;
    for (size_t t = 0; t < 4 && is_meta; ++t) is_meta = lower(s[lt + 1 + t]) == "meta"[t];
    if (!is_meta || !(space(s[lt + 5]) || s[lt + 5] == '/')) continue;
    // The attributes, up to '>'.
    size_t p = lt + 5;
    std::string charset, content, http_equiv;
    while (p < s.size() && s[p] != '>') {
      while (p < s.size() && (space(s[p]) || s[p] == '/')) ++p;
      if (p >= s.size() || s[p] == '>') break;
      size_t n0 = p;
      while (p < s.size() && !space(s[p]) && s[p] != '=' && s[p] != '>' && s[p] != '/') ++p;
      std::string name = trim_label(s.substr(n0, p - n0));
      while (p < s.size() && space(s[p])) ++p;
      std::string value;
      if (p < s.size() && s[p] == '=') {
        ++p;
        while (p < s.size() && space(s[p])) ++p;
        if (p < s.size() && (s[p] == '"' || s[p] == '\'')) {
          size_t q = s.find(s[p], p + 1);
          if (q == std::string_view::npos) q = s.size();
          value = std::string(s.substr(p + 1, q - p - 1));
          p = std::min(q + 1, s.size());
        } else {
          size_t q = p;
          while (q < s.size() && !space(s[q]) && s[q] != '>') ++q;
          value = std::string(s.substr(p, q - p));
          p = q;
        }
      }
      if (name == "charset" && charset.empty()) charset = trim_label(value);
      if (name == "content" && content.empty()) content = value;
      if (name == "http-equiv" && http_equiv.empty()) http_equiv = trim_label(value);
    }
    if (!charset.empty()) return charset;
    // WHATWG asks for http-equiv="content-type"; a content="...charset=..."
    // without it is still a declaration.
    if (!content.empty() && (http_equiv.empty() || http_equiv == "content-type")) {
      std::string c = charset_in_content(content);
      if (!c.empty()) return c;
    }
  }
  return {};
}

std::string detect_charset(std::string_view bytes) {
  struct Deleter {
    void operator()(uchardet_t u) const { uchardet_delete(u); }
  };
  thread_local std::unique_ptr<std::remove_pointer_t<uchardet_t>, Deleter> ud(uchardet_new());
  // The text around the non-ASCII bytes is what tells charsets apart: skip a
  // long ASCII head (scripts, styles), keep some context, and stop at 256 KiB.
  size_t first = 0;
  while (first < bytes.size() && static_cast<unsigned char>(bytes[first]) < 0x80) ++first;
  if (first == bytes.size()) return "ASCII";
  size_t from = first > 1024 ? first - 1024 : 0;
  std::string_view part = bytes.substr(from, size_t(256) << 10);
  uchardet_reset(ud.get());
  if (uchardet_handle_data(ud.get(), part.data(), part.size()) != 0) return {};
  uchardet_data_end(ud.get());
  const char* cs = uchardet_get_charset(ud.get());
  return cs ? std::string(cs) : std::string();
}

DecodedText decode_to_utf8(std::string_view bytes, std::string_view header_charset, bool html) {
  DecodedText r;
  int64_t replaced = 0;
  auto as_utf8 = [&](std::string_view b, CharsetFrom from) {
    size_t keep = 0;
    if (valid_utf8(b, keep)) {
      r.text.assign(b.data(), keep);
    } else {
      r.text = replace_invalid_utf8(b);
      r.lossy = true;
    }
    r.charset = "utf-8";
    r.from = from;
    return r;
  };

  // A byte-order mark decides.
  if (bytes.size() >= 3 && bytes.compare(0, 3, "\xEF\xBB\xBF") == 0)
    return as_utf8(bytes.substr(3), CharsetFrom::Bom);
  if (bytes.size() >= 2 &&
      (bytes.compare(0, 2, "\xFF\xFE") == 0 || bytes.compare(0, 2, "\xFE\xFF") == 0)) {
    r.charset = bytes[0] == '\xFF' ? "utf-16le" : "utf-16be";
    r.from = CharsetFrom::Bom;
    transcode(bytes.substr(2), r.charset, false, r.text, replaced);
    r.lossy = replaced > 0;
    return r;
  }

  const bool non_ascii = has_non_ascii(bytes);
  size_t utf8_keep = 0;
  const bool utf8 = valid_utf8(bytes, utf8_keep);
  std::string first_known;  // the first declared charset ICU knows
  CharsetFrom first_from = CharsetFrom::Default;

  struct Declared {
    std::string label;
    CharsetFrom from;
  };
  Declared declared[2] = {{std::string(header_charset), CharsetFrom::Header},
                          {html ? meta_charset(bytes) : std::string(), CharsetFrom::Meta}};
  for (const Declared& d : declared) {
    if (trim_label(d.label).empty()) continue;
    std::string name = resolve_charset(d.label);
    // A <meta> naming UTF-16 in a page read as bytes means UTF-8 (WHATWG).
    if (d.from == CharsetFrom::Meta && name.rfind("utf-16", 0) == 0) name = "utf-8";
    if (name.empty()) {
      r.declared_unusable = true;
      continue;
    }
    if (first_known.empty()) {
      first_known = name;
      first_from = d.from;
    }
    if (name == "utf-8") {
      if (utf8) return as_utf8(bytes, d.from);
      r.declared_unusable = true;
      continue;
    }
    const Converter& c = converter(name);
    if (!non_ascii && c.ascii_compatible) {
      r.text = std::string(bytes);
      r.charset = name;
      r.from = d.from;
      return r;
    }
    if (utf8 && non_ascii && c.ascii_compatible) {  // mislabelled: the bytes are UTF-8
      r.declared_unusable = true;
      continue;
    }
    if (transcode(bytes, name, true, r.text, replaced)) {
      r.charset = name;
      r.from = d.from;
      return r;
    }
    r.declared_unusable = true;
  }

  // Detection.
  if (!non_ascii) {
    r.text = std::string(bytes);
    r.charset = "ascii";
    r.from = CharsetFrom::Detected;
    return r;
  }
  if (utf8) return as_utf8(bytes, CharsetFrom::Detected);
  std::string detected = resolve_charset(detect_charset(bytes));
  if (detected == "windows-1250" || detected == "iso-8859-2") {
    // uchardet confuses these two (they differ in a dozen byte values); the
    // one that reads more of those bytes as letters is right.
    std::string a, b;
    int64_t ra = 0, rb = 0;
    bool oka = transcode(bytes, "iso-8859-2", true, a, ra);
    bool okb = transcode(bytes, "windows-1250", true, b, rb);
    int64_t la = oka ? non_ascii_letters(a) : -1, lb = okb ? non_ascii_letters(b) : -1;
    if (la > lb) detected = "iso-8859-2";
    if (lb > la) detected = "windows-1250";
  }
  if (!detected.empty() && transcode(bytes, detected, true, r.text, replaced)) {
    r.charset = detected;
    r.from = CharsetFrom::Detected;
    return r;
  }
  // Nothing decodes every byte: the page's own word, else detection's, else
  // windows-1252, with U+FFFD for what it cannot decode.
  if (!first_known.empty()) {
    r.charset = first_known;
    r.from = first_from;
  } else if (!detected.empty()) {
    r.charset = detected;
    r.from = CharsetFrom::Detected;
  } else {
    r.charset = "windows-1252";
    r.from = CharsetFrom::Default;
  }
  if (r.charset == "utf-8") return as_utf8(bytes, r.from);
  transcode(bytes, r.charset, false, r.text, replaced);
  r.lossy = replaced > 0;
  return r;
}

}  // namespace nk::curate
