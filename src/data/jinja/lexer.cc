#include "data/jinja/lexer.h"

#include <algorithm>

#include "data/jinja/js_text.h"
#include "data/jinja/render_error.h"

namespace nk::jinja {
namespace {

// Preprocessed text with, for each byte, its offset in the original source.
struct Mapped {
  std::string text;
  std::vector<uint32_t> at;
  void push(char c, uint32_t from) {
    text += c;
    at.push_back(from);
  }
};

bool is_space(std::string_view s, size_t i) {
  return space_at(s, i) > 0;
}

// The reference's regular-expression passes, in its order:
//   a single trailing "\n" removed;
//   lstrip_blocks  /^[ \t]*({[#%-])/gm -> "$1" (line starts as JavaScript's
//                  multiline ^ sees them: after \n, \r, U+2028, U+2029);
//   trim_blocks    /([#%-]})\n/g -> "$1";
//   generation     /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs ->
//                  the spaces kept unless that side has its "-".
Mapped preprocess(std::string_view src, bool chat) {
  Mapped m;
  const size_t n = chat && src.ends_with('\n') ? src.size() - 1 : src.size();
  for (size_t i = 0; i < n; ++i) m.push(src[i], uint32_t(i));

  auto line_start = [](const std::string& t, size_t i) {
    if (i == 0) return true;
    const char c = t[i - 1];
    if (c == '\n' || c == '\r') return true;
    // U+2028 / U+2029: E2 80 A8 / E2 80 A9.
    return i >= 3 && t.compare(i - 3, 2, "\xE2\x80") == 0 &&
           (static_cast<unsigned char>(c) == 0xA8 || static_cast<unsigned char>(c) == 0xA9);
  };
  Mapped l;  // lstrip_blocks
  for (size_t i = 0; i < m.text.size();) {
    if (chat && line_start(m.text, i)) {
      size_t j = i;
      while (j < m.text.size() && (m.text[j] == ' ' || m.text[j] == '\t')) ++j;
      if (j > i && j + 1 < m.text.size() && m.text[j] == '{' &&
          (m.text[j + 1] == '#' || m.text[j + 1] == '%' || m.text[j + 1] == '-'))
        i = j;
    }
    l.push(m.text[i], m.at[i]);
    ++i;
  }
  Mapped t;  // trim_blocks
  for (size_t i = 0; i < l.text.size(); ++i) {
    t.push(l.text[i], l.at[i]);
    const char c = l.text[i];
    if (chat && (c == '#' || c == '%' || c == '-') && i + 2 < l.text.size() &&
        l.text[i + 1] == '}' && l.text[i + 2] == '\n') {
      t.push('}', l.at[i + 1]);
      i += 2;
    }
  }
  // {% generation %} / {% endgeneration %}: transformers' assistant-mask tags.
  Mapped g;
  const std::string& s = t.text;
  size_t done = 0;  // bytes of s already copied or consumed by a match
  for (size_t p = s.find("{%"); p != std::string::npos; p = s.find("{%", p + 1)) {
    if (p < done) continue;
    size_t j = p + 2;
    const bool lstrip = j < s.size() && s[j] == '-';
    if (lstrip) ++j;
    while (is_space(s, j)) j += space_at(s, j);
    if (s.compare(j, 3, "end") == 0 && s.compare(j + 3, 10, "generation") == 0) j += 3;
    if (s.compare(j, 10, "generation") != 0) continue;
    j += 10;
    while (is_space(s, j)) j += space_at(s, j);
    const bool rstrip = j < s.size() && s[j] == '-';
    if (rstrip) ++j;
    if (s.compare(j, 2, "%}") != 0) continue;
    j += 2;
    // The spaces before, back to what an earlier match consumed.
    size_t before = p;
    while (before > done) {
      size_t k = before - 1;
      while (k > done && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
      if (space_at(s, k) != before - k) break;
      before = k;
    }
    size_t after = j;
    while (is_space(s, after)) after += space_at(s, after);
    for (size_t k = done; k < before; ++k) g.push(s[k], t.at[k]);
    if (!lstrip)
      for (size_t k = before; k < p; ++k) g.push(s[k], t.at[k]);
    if (!rstrip)
      for (size_t k = j; k < after; ++k) g.push(s[k], t.at[k]);
    done = after;
  }
  for (size_t k = done; k < s.size(); ++k) g.push(s[k], t.at[k]);
  return g;
}

bool digit(char c) {
  return c >= '0' && c <= '9';
}
bool word(char c) {
  return digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

struct Fixed {
  const char* text;
  Tok type;
};
// Longest first where one is a prefix of another, as the reference orders them.
constexpr Fixed kFixed[] = {
    {"{%", Tok::OpenStatement},  {"%}", Tok::CloseStatement},
    {"{{", Tok::OpenExpression}, {"}}", Tok::CloseExpression},
    {"(", Tok::OpenParen},       {")", Tok::CloseParen},
    {"{", Tok::OpenCurly},       {"}", Tok::CloseCurly},
    {"[", Tok::OpenSquare},      {"]", Tok::CloseSquare},
    {",", Tok::Comma},           {".", Tok::Dot},
    {":", Tok::Colon},           {"|", Tok::Pipe},
    {"<=", Tok::Comparison},     {">=", Tok::Comparison},
    {"==", Tok::Comparison},     {"!=", Tok::Comparison},
    {"<", Tok::Comparison},      {">", Tok::Comparison},
    {"+", Tok::Additive},        {"-", Tok::Additive},
    {"~", Tok::Additive},        {"**", Tok::Exponent},
    {"*", Tok::Multiplicative},  {"//", Tok::Multiplicative},
    {"/", Tok::Multiplicative},  {"%", Tok::Multiplicative},
    {"=", Tok::Equals},
};

void append_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

class Lexer {
 public:
  explicit Lexer(Mapped m) : m_(std::move(m)), s_(m_.text) {}

  std::vector<Token> run() {
    while (i_ < s_.size()) step();
    return std::move(out_);
  }

 private:
  [[noreturn]] void error_at(size_t i, const std::string& msg) const {
    throw RenderError{msg, origin(i)};
  }
  uint32_t origin(size_t i) const {
    if (m_.at.empty()) return 0;
    return i < m_.at.size() ? m_.at[i] : m_.at.back() + 1;
  }
  bool at(size_t i, std::string_view what) const { return s_.compare(i, what.size(), what) == 0; }
  void push(Tok t, std::string v, size_t start) {
    out_.push_back({t, std::move(v), origin(start)});
  }
  Tok last() const { return out_.empty() ? Tok::Text : out_.back().type; }

  void strip_trailing_space() {
    if (out_.empty() || out_.back().type != Tok::Text) return;
    std::string& v = out_.back().value;
    v.resize(trim_end(v).size());
    if (v.empty()) out_.pop_back();
  }
  void skip_space() {
    while (i_ < s_.size() && is_space(s_, i_)) i_ += space_at(s_, i_);
  }

  // A string literal's contents up to `quote`, escapes resolved.
  std::string string_body(char quote, size_t start) {
    std::string v;
    while (true) {
      if (i_ >= s_.size()) error_at(start, "a string literal is never closed");
      const char c = s_[i_];
      if (c == quote) break;
      if (c == '\\') {
        if (++i_ >= s_.size()) error_at(i_, "unexpected end of the template after '\\'");
        const char e = s_[i_++];
        if (e == 'x' || e == 'u') {
          const size_t len = e == 'x' ? 2 : 4;
          const std::string hex = s_.substr(i_, len);
          if (hex.size() != len ||
              hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
            error_at(i_ - 2, "invalid hexadecimal escape sequence \\" + std::string(1, e) + hex);
          char32_t cp = char32_t(std::stoul(hex, nullptr, 16));
          i_ += len;
          // A surrogate pair written as two escapes is one character.
          if (cp >= 0xD800 && cp < 0xDC00 && at(i_, "\\u") && i_ + 6 <= s_.size()) {
            const std::string lo = s_.substr(i_ + 2, 4);
            if (lo.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos) {
              const char32_t low = char32_t(std::stoul(lo, nullptr, 16));
              if (low >= 0xDC00 && low < 0xE000) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                i_ += 6;
              }
            }
          }
          if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;  // a lone surrogate
          append_utf8(cp, v);
          continue;
        }
        switch (e) {
          case 'n':
            v += '\n';
            break;
          case 't':
            v += '\t';
            break;
          case 'r':
            v += '\r';
            break;
          case 'b':
            v += '\b';
            break;
          case 'f':
            v += '\f';
            break;
          case 'v':
            v += '\v';
            break;
          case '\'':
          case '"':
          case '\\':
            v += e;
            break;
          default:
            error_at(i_ - 2,
                     std::string("unknown escape sequence \\") + e + " in a string literal");
        }
        continue;
      }
      v += c;
      ++i_;
    }
    ++i_;  // the closing quote
    return v;
  }

  std::string digits() {
    const size_t from = i_;
    while (i_ < s_.size() && digit(s_[i_])) ++i_;
    return s_.substr(from, i_ - from);
  }

  void step() {
    const Tok prev = last();
    // Text up to the next tag, after a tag (or at the start).
    if (out_.empty() || prev == Tok::CloseStatement || prev == Tok::CloseExpression ||
        prev == Tok::Comment) {
      const size_t from = i_;
      while (i_ < s_.size() && !(s_[i_] == '{' && i_ + 1 < s_.size() &&
                                 (s_[i_ + 1] == '%' || s_[i_ + 1] == '{' || s_[i_ + 1] == '#')))
        ++i_;
      if (i_ > from) {
        push(Tok::Text, s_.substr(from, i_ - from), from);
        return;
      }
    }
    if (at(i_, "{#")) {
      const size_t start = i_;
      i_ += 2;
      const bool strip_before = i_ < s_.size() && s_[i_] == '-';
      if (strip_before) ++i_;
      const size_t end = s_.find("#}", i_);
      if (end == std::string::npos) error_at(start, "a comment {# is never closed with #}");
      std::string text = s_.substr(i_, end - i_);
      const bool strip_after = text.ends_with('-');
      if (strip_after) text.pop_back();
      if (strip_before) strip_trailing_space();
      push(Tok::Comment, std::move(text), start);
      i_ = end + 2;
      if (strip_after) skip_space();
      return;
    }
    if (at(i_, "{%-") || at(i_, "{{-")) {
      strip_trailing_space();
      push(s_[i_ + 1] == '%' ? Tok::OpenStatement : Tok::OpenExpression, s_.substr(i_, 2), i_);
      i_ += 3;
      return;
    }
    skip_space();
    if (i_ >= s_.size()) return;
    if (at(i_, "-%}") || at(i_, "-}}")) {
      push(s_[i_ + 1] == '%' ? Tok::CloseStatement : Tok::CloseExpression, s_.substr(i_ + 1, 2),
           i_);
      i_ += 3;
      skip_space();
      return;
    }
    const char c = s_[i_];
    if (c == '-' || c == '+') {
      if (prev == Tok::Text || out_.empty())
        error_at(i_, std::string("unexpected character '") + c + "'");
      const bool binary = prev == Tok::Identifier || prev == Tok::Number || prev == Tok::String ||
                          prev == Tok::CloseParen || prev == Tok::CloseSquare;
      if (!binary) {  // a sign: part of a number when digits follow
        const size_t start = i_++;
        std::string num = digits();
        if (!num.empty() && i_ + 1 < s_.size() && s_[i_] == '.' && digit(s_[i_ + 1])) {
          ++i_;
          num += "." + digits();
        }
        push(num.empty() ? Tok::Unary : Tok::Number, c + num, start);
        return;
      }
    }
    for (const Fixed& f : kFixed) {
      if (f.type == Tok::CloseExpression && curly_depth_ > 0) continue;  // "}}" inside {...}
      if (!at(i_, f.text)) continue;
      push(f.type, f.text, i_);
      if (f.type == Tok::OpenExpression) curly_depth_ = 0;
      if (f.type == Tok::OpenCurly) ++curly_depth_;
      if (f.type == Tok::CloseCurly) --curly_depth_;
      i_ += std::char_traits<char>::length(f.text);
      return;
    }
    if (c == '\'' || c == '"') {
      const size_t start = i_++;
      push(Tok::String, string_body(c, start), start);
      return;
    }
    if (digit(c)) {
      const size_t start = i_;
      std::string num = digits();
      if (prev != Tok::Dot && i_ + 1 < s_.size() && s_[i_] == '.' && digit(s_[i_ + 1])) {
        ++i_;
        num += "." + digits();
      }
      push(Tok::Number, std::move(num), start);
      return;
    }
    if (word(c)) {
      const size_t start = i_;
      while (i_ < s_.size() && word(s_[i_])) ++i_;
      push(Tok::Identifier, s_.substr(start, i_ - start), start);
      return;
    }
    error_at(i_, fmt::format("unexpected character '{}'",
                             static_cast<unsigned char>(c) < 0x80
                                 ? std::string(1, c)
                                 : std::string("\\x") +
                                       fmt::format("{:02X}", static_cast<unsigned char>(c))));
  }

  Mapped m_;
  const std::string& s_;
  size_t i_ = 0;
  int curly_depth_ = 0;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, bool chat) {
  return Lexer(preprocess(source, chat)).run();
}

std::pair<int, int> line_col(std::string_view source, uint32_t pos) {
  const size_t end = std::min<size_t>(pos, source.size());
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < end; ++i)
    if (source[i] == '\n') ++line, line_start = i + 1;
  return {line, int(end - line_start) + 1};
}

}  // namespace nk::jinja
