#include "data/tokenizer/text_normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/casemap.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <optional>

#include "core/error.h"
#include "core/json.h"
#include "data/tokenizer/pretokenizer.h"
#include "data/utf8.h"

namespace nk {

namespace {

using nlohmann::json;

std::string string_option(const json& obj, const char* key, const std::string& where,
                          const std::string& file) {
  const json& v = json_member(obj, key);
  if (!v.is_string()) fail("{}: {}.{} must be a string, got {}", file, where, key, v.dump());
  return v.get<std::string>();
}

// A boolean option; `absent` when missing (or null where null means the default).
bool bool_option(const json& obj, const char* key, bool absent, const std::string& where,
                 const std::string& file) {
  const json& v = json_member(obj, key);
  if (v.is_null()) return absent;
  if (!v.is_boolean()) fail("{}: {}.{} must be true or false, got {}", file, where, key, v.dump());
  return v.get<bool>();
}

// Calls fn(code point, its bytes) for each character of valid UTF-8 `s`.
template <class F>
void for_each_code_point(std::string_view s, F&& fn) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const int32_t n = int32_t(s.size());
  for (int32_t i = 0; i < n;) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(p, i, n, c);
    fn(c, s.substr(size_t(start), size_t(i - start)));
  }
}

bool has_category(UChar32 c, uint32_t mask) {
  return (U_GET_GC_MASK(c) & mask) != 0;
}

// The Unicode normalization form `form` of `s` (ICU works on the UTF-8 as is).
std::string unicode_normalize(const icu::Normalizer2& form, std::string_view s) {
  std::string out;
  out.reserve(s.size());
  icu::StringByteSink<std::string> sink(&out);
  UErrorCode ec = U_ZERO_ERROR;
  form.normalizeUTF8(0, icu::StringPiece(s.data(), int32_t(s.size())), sink, nullptr, ec);
  if (U_FAILURE(ec)) fail("normalizer: ICU's normalization failed: {}", u_errorName(ec));
  return out;
}

// Each code point's full lowercase mapping on its own (no Final_Sigma context).
std::string lowercase_each(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  icu::StringByteSink<std::string> sink(&out);
  for_each_code_point(s, [&](UChar32 c, std::string_view bytes) {
    if (c < 0x80) return out.push_back(char(c >= 'A' && c <= 'Z' ? c + 32 : c));
    UErrorCode ec = U_ZERO_ERROR;
    icu::CaseMap::utf8ToLower("", 0, icu::StringPiece(bytes.data(), int32_t(bytes.size())), sink,
                              nullptr, ec);
    if (U_FAILURE(ec)) fail("normalizer: ICU's lowercase mapping failed: {}", u_errorName(ec));
  });
  return out;
}

// `s` without the characters `drop` says to drop.
template <class Drop>
std::string drop_chars(std::string_view s, Drop&& drop) {
  std::string out;
  out.reserve(s.size());
  for_each_code_point(s, [&](UChar32 c, std::string_view bytes) {
    if (!drop(c)) out += bytes;
  });
  return out;
}

std::string strip_white_space(std::string_view s, bool left, bool right) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  int32_t b = 0, e = int32_t(s.size());
  while (left && b < e) {
    int32_t next = b;
    UChar32 c;
    U8_NEXT(p, next, e, c);
    if (!u_isUWhiteSpace(c)) break;
    b = next;
  }
  while (right && e > b) {
    int32_t prev = e;
    UChar32 c;
    U8_PREV(p, b, prev, c);
    if (!u_isUWhiteSpace(c)) break;
    e = prev;
  }
  return std::string(s.substr(size_t(b), size_t(e - b)));
}

// BERT's CJK ideograph blocks (its is_chinese_char), with ' ' put around each.
bool is_cjk_ideograph(UChar32 c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

const icu::Normalizer2& icu_form(const std::string& type) {
  UErrorCode ec = U_ZERO_ERROR;
  const icu::Normalizer2* n = type == "NFC"    ? icu::Normalizer2::getNFCInstance(ec)
                              : type == "NFD"  ? icu::Normalizer2::getNFDInstance(ec)
                              : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(ec)
                                               : icu::Normalizer2::getNFKDInstance(ec);
  if (U_FAILURE(ec) || !n)
    fail("normalizer {}: ICU has no such instance: {}", type, u_errorName(ec));
  return *n;
}

}  // namespace

struct TextNormalizer::Step {
  enum Kind { kForm, kLowercase, kReplace, kPrepend, kStrip, kStripAccents, kBert } kind;
  const icu::Normalizer2* form = nullptr;  // kForm
  std::string text;                        // kReplace: the literal pattern; kPrepend
  std::string content;                     // kReplace
  std::optional<PreTokenizer> regex;       // kReplace with a Regex pattern
  bool left = false, right = false;        // kStrip
  // kBert
  bool clean_text = true, chinese_chars = true, strip_accents = true, lower = true;

  std::string apply(std::string_view s) const;
  std::string replace(std::string_view s) const;
  std::string bert(std::string_view s) const;
};

std::string TextNormalizer::Step::replace(std::string_view s) const {
  std::string out;
  out.reserve(s.size());
  size_t done = 0;
  auto put = [&](size_t at, size_t len) {
    out.append(s.substr(done, at - done));
    out += content;
    done = at + len;
  };
  if (regex) {
    regex->for_each_piece_valid(
        s, [&](std::string_view m) { put(size_t(m.data() - s.data()), m.size()); });
  } else {
    for (size_t at = s.find(text); at != std::string_view::npos; at = s.find(text, done))
      put(at, text.size());
  }
  out.append(s.substr(done));
  return out;
}

std::string TextNormalizer::Step::bert(std::string_view s) const {
  std::string t(s);
  if (clean_text) {
    std::string out;
    out.reserve(t.size());
    for_each_code_point(t, [&](UChar32 c, std::string_view bytes) {
      const bool tab_or_newline = c == '\t' || c == '\n' || c == '\r';
      if (c == 0 || c == 0xFFFD ||
          (!tab_or_newline &&
           has_category(c, U_GC_CC_MASK | U_GC_CF_MASK | U_GC_CO_MASK | U_GC_CS_MASK)))
        return;
      if (tab_or_newline || u_isUWhiteSpace(c)) return out.push_back(' ');
      out += bytes;
    });
    t = std::move(out);
  }
  if (chinese_chars) {
    std::string out;
    out.reserve(t.size());
    for_each_code_point(t, [&](UChar32 c, std::string_view bytes) {
      if (!is_cjk_ideograph(c)) return void(out += bytes);
      out.push_back(' ');
      out += bytes;
      out.push_back(' ');
    });
    t = std::move(out);
  }
  if (strip_accents)
    t = drop_chars(unicode_normalize(icu_form("NFD"), t),
                   [](UChar32 c) { return has_category(c, U_GC_MN_MASK); });
  if (lower) t = lowercase_each(t);
  return t;
}

std::string TextNormalizer::Step::apply(std::string_view s) const {
  switch (kind) {
    case kForm:
      return unicode_normalize(*form, s);
    case kLowercase:
      return lowercase_each(s);
    case kReplace:
      return replace(s);
    case kPrepend:
      return s.empty() ? std::string() : text + std::string(s);
    case kStrip:
      return strip_white_space(s, left, right);
    case kStripAccents:
      return drop_chars(s, [](UChar32 c) { return has_category(c, U_GC_M_MASK); });
    case kBert:
      return bert(s);
  }
  return std::string(s);
}

namespace {

void add_normalizer_steps(const json& j, const std::string& file, const std::string& where,
                          std::vector<std::unique_ptr<TextNormalizer::Step>>& steps) {
  using Step = TextNormalizer::Step;
  if (!j.is_object()) fail("{}: {} must be an object, got {}", file, where, j.dump());
  const json& t = json_member(j, "type");
  if (!t.is_string()) fail("{}: {}.type must be a string, got {}", file, where, t.dump());
  const std::string type = t.get<std::string>();
  if (type == "Sequence") {
    const json& list = json_member(j, "normalizers");
    if (!list.is_array())
      fail("{}: {}.normalizers must be an array, got {}", file, where, list.dump());
    for (size_t i = 0; i < list.size(); ++i)
      add_normalizer_steps(list[i], file, fmt::format("{}.normalizers[{}]", where, i), steps);
    return;
  }
  auto s = std::make_unique<Step>();
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    s->kind = Step::kForm;
    s->form = &icu_form(type);
  } else if (type == "Lowercase") {
    s->kind = Step::kLowercase;
  } else if (type == "StripAccents") {
    s->kind = Step::kStripAccents;
  } else if (type == "Prepend") {
    s->kind = Step::kPrepend;
    s->text = string_option(j, "prepend", where, file);
  } else if (type == "Strip") {
    s->kind = Step::kStrip;
    s->left = bool_option(j, "strip_left", false, where, file);
    s->right = bool_option(j, "strip_right", false, where, file);
  } else if (type == "Replace") {
    s->kind = Step::kReplace;
    s->content = string_option(j, "content", where, file);
    const json& pattern = json_member(j, "pattern");
    const json& literal = json_member(pattern, "String");
    const json& regex = json_member(pattern, "Regex");
    if (literal.is_string() && !literal.get<std::string>().empty()) {
      s->text = literal.get<std::string>();
    } else if (regex.is_string()) {
      const std::string key = fmt::format("{}: {}.pattern.Regex", file, where);
      try {
        s->regex.emplace(regex.get<std::string>());
      } catch (const Error& e) {
        throw e.with_context(key);
      }
      if (s->regex->can_match_empty())
        fail("{} '{}' can match the empty string: not supported", key, regex.get<std::string>());
    } else {
      fail("{}: {}.pattern must be {{\"String\": non-empty text}} or {{\"Regex\": ...}}, got {}",
           file, where, pattern.dump());
    }
  } else if (type == "BertNormalizer") {
    s->kind = Step::kBert;
    s->clean_text = bool_option(j, "clean_text", true, where, file);
    s->chinese_chars = bool_option(j, "handle_chinese_chars", true, where, file);
    s->lower = bool_option(j, "lowercase", true, where, file);
    s->strip_accents = bool_option(j, "strip_accents", s->lower, where, file);
  } else {
    fail(
        "{}: {}.type '{}' is not supported: Nekton's normalizers are NFC, NFD, NFKC, NFKD, "
        "Lowercase, Replace, Prepend, Strip, StripAccents, BertNormalizer and a Sequence of them",
        file, where, type);
  }
  steps.push_back(std::move(s));
}

}  // namespace

TextNormalizer::TextNormalizer() = default;
TextNormalizer::~TextNormalizer() = default;

std::unique_ptr<TextNormalizer> TextNormalizer::from_json(const json& j, const std::string& file,
                                                          const std::string& where) {
  if (j.is_null()) return nullptr;
  std::unique_ptr<TextNormalizer> n(new TextNormalizer());
  add_normalizer_steps(j, file, where, n->steps_);
  if (n->steps_.empty()) return nullptr;
  return n;
}

std::string TextNormalizer::normalize(std::string_view text) const {
  // Invalid UTF-8 repaired as the tokenizers repair it (U+FFFD per maximal subpart).
  std::string s = find_invalid_utf8(text) < 0 ? std::string(text) : replace_invalid_utf8(text);
  for (const auto& step : steps_) s = step->apply(s);
  return s;
}

}  // namespace nk
