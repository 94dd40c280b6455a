#include "curate/extract/latex_extract.h"
#include "curate/extract/text_writer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#include "curate/extract/clean.h"

namespace nk::curate {

namespace {

constexpr size_t npos = std::string_view::npos;

inline bool is_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// Paragraph-aware output: source whitespace becomes one space, blank lines
// and block boundaries "\n\n", line breaks "\n"; nothing trails.
struct LatexWriter : ParagraphWriter {
  void text(std::string_view t) {
    if (t.empty()) return;
    flush();
    out.append(t);
  }
  // As written, line breaks kept (verbatim blocks), each line trimmed at the end.
  void raw(std::string_view t) {
    flush();
    for (char c : t) {
      if (c == '\r') continue;
      if (c == '\n')
        while (!out.empty() && (out.back() == ' ' || out.back() == '\t')) out.pop_back();
      out.push_back(c);
    }
  }
  std::string finish() {
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ' || out.back() == '\t'))
      out.pop_back();
    return std::move(out);
  }
};

struct Named {
  std::string_view name;
  std::string_view value;
};

// Macros that stand for a character or a word.
constexpr Named kSymbols[] = {
    {"LaTeX", "LaTeX"},
    {"TeX", "TeX"},
    {"LaTeXe", "LaTeX2e"},
    {"ldots", "…"},
    {"dots", "…"},
    {"textellipsis", "…"},
    {"textbackslash", "\\"},
    {"S", "§"},
    {"P", "¶"},
    {"copyright", "©"},
    {"textcopyright", "©"},
    {"textregistered", "®"},
    {"texttrademark", "™"},
    {"pounds", "£"},
    {"textsterling", "£"},
    {"euro", "€"},
    {"texteuro", "€"},
    {"textdegree", "°"},
    {"ss", "ß"},
    {"SS", "SS"},
    {"o", "ø"},
    {"O", "Ø"},
    {"ae", "æ"},
    {"AE", "Æ"},
    {"oe", "œ"},
    {"OE", "Œ"},
    {"aa", "å"},
    {"AA", "Å"},
    {"l", "ł"},
    {"L", "Ł"},
    {"i", "ı"},
    {"j", "ȷ"},
    {"dag", "†"},
    {"ddag", "‡"},
    {"textendash", "–"},
    {"textemdash", "—"},
    {"textquoteleft", "‘"},
    {"textquoteright", "’"},
    {"textquotedblleft", "“"},
    {"textquotedblright", "”"},
    {"guillemotleft", "«"},
    {"guillemotright", "»"},
    {"textasciitilde", "~"},
    {"textasciicircum", "^"},
    {"textunderscore", "_"},
    {"textbar", "|"},
    {"textless", "<"},
    {"textgreater", ">"},
    {"slash", "/"},
    {"textbullet", "•"},
    {"checkmark", "✓"},
};

// Macros dropped together with this many brace arguments (their optional
// [..] arguments go too).
struct Dropped {
  std::string_view name;
  int args;
};
constexpr Dropped kDropped[] = {
    {"cite", 1},
    {"citep", 1},
    {"citet", 1},
    {"citealp", 1},
    {"citealt", 1},
    {"citeauthor", 1},
    {"citeyear", 1},
    {"parencite", 1},
    {"textcite", 1},
    {"autocite", 1},
    {"footcite", 1},
    {"nocite", 1},
    {"ref", 1},
    {"eqref", 1},
    {"pageref", 1},
    {"autoref", 1},
    {"cref", 1},
    {"Cref", 1},
    {"vref", 1},
    {"nameref", 1},
    {"label", 1},
    {"footnote", 1},
    {"footnotetext", 1},
    {"index", 1},
    {"includegraphics", 1},
    {"input", 1},
    {"include", 1},
    {"bibliography", 1},
    {"bibliographystyle", 1},
    {"usepackage", 1},
    {"documentclass", 1},
    {"RequirePackage", 1},
    {"newenvironment", 3},
    {"renewenvironment", 3},
    {"newtheorem", 2},
    {"setlength", 2},
    {"addtolength", 2},
    {"setcounter", 2},
    {"addtocounter", 2},
    {"vspace", 1},
    {"hspace", 1},
    {"pagestyle", 1},
    {"thispagestyle", 1},
    {"pagenumbering", 1},
    {"hypersetup", 1},
    {"color", 1},
    {"textcolor", 1},
    {"colorbox", 1},
    {"fontsize", 2},
    {"rule", 2},
    {"raisebox", 1},
    {"parbox", 1},
    {"resizebox", 2},
    {"scalebox", 1},
    {"bibitem", 1},
    {"phantom", 1},
    {"hphantom", 1},
    {"vphantom", 1},
    {"captionof", 1},
    {"DeclareMathOperator", 2},
    {"graphicspath", 1},
    {"addbibresource", 1},
    {"linespread", 1},
    {"newcounter", 1},
    {"settowidth", 2},
    {"href", 1},
    {"selectlanguage", 1},
    {"foreignlanguage", 1},
};

constexpr std::string_view kSections[] = {"part",          "chapter",   "section",     "subsection",
                                          "subsubsection", "paragraph", "subparagraph"};

// Environments dropped with their content; those marked keep their captions.
struct DroppedEnv {
  std::string_view name;
  bool captions;  // a float: its captions are kept, each a paragraph
};
constexpr DroppedEnv kDroppedEnvs[] = {
    {"equation", false},     {"equation*", false},    {"align", false},
    {"align*", false},       {"alignat", false},      {"alignat*", false},
    {"gather", false},       {"gather*", false},      {"multline", false},
    {"multline*", false},    {"eqnarray", false},     {"eqnarray*", false},
    {"displaymath", false},  {"math", false},         {"flalign", false},
    {"flalign*", false},     {"figure", true},        {"figure*", true},
    {"table", true},         {"table*", true},        {"wrapfigure", true},
    {"wraptable", true},     {"subfigure", true},     {"sidewaysfigure", true},
    {"sidewaystable", true}, {"algorithm", true},     {"tikzpicture", false},
    {"picture", false},      {"pspicture", false},    {"thebibliography", false},
    {"comment", false},      {"filecontents", false}, {"filecontents*", false},
};

constexpr std::string_view kVerbatimEnvs[] = {"verbatim", "verbatim*", "Verbatim", "lstlisting",
                                              "minted"};

template <class T>
const T* lookup(const T* begin, const T* end, std::string_view name) {
  for (const T* p = begin; p != end; ++p)
    if (p->name == name) return p;
  return nullptr;
}

// UTF-8 of a combining mark for an accent macro, or "".
std::string_view combining_mark(std::string_view accent) {
  if (accent.size() != 1) return "";
  switch (accent[0]) {
    case '\'':
      return "\xCC\x81";
    case '`':
      return "\xCC\x80";
    case '^':
      return "\xCC\x82";
    case '"':
      return "\xCC\x88";
    case '~':
      return "\xCC\x83";
    case '=':
      return "\xCC\x84";
    case '.':
      return "\xCC\x87";
    case 'c':
      return "\xCC\xA7";
    case 'v':
      return "\xCC\x8C";
    case 'u':
      return "\xCC\x86";
    case 'H':
      return "\xCC\x8B";
    case 'k':
      return "\xCC\xA8";
    case 'r':
      return "\xCC\x8A";
    case 'd':
      return "\xCC\xA3";
    case 'b':
      return "\xCC\xB1";
    default:
      return "";
  }
}

constexpr int kMaxNesting = 4;  // captions inside captions and the like

class Converter {
 public:
  Converter(std::string_view s, int nesting) : s_(s), nesting_(nesting) {}

  std::string run() {
    size_t n = s_.size();
    while (i_ < n) {
      char c = s_[i_];
      switch (c) {
        case '\\':
          control();
          break;
        case '{':
          groups_.push_back('n');
          ++i_;
          break;
        case '}':
          ++i_;
          if (!groups_.empty()) {
            char g = groups_.back();
            groups_.pop_back();
            if (g == 'h') w_.block(2);
          }
          break;
        case '%':
          comment();
          break;
        case '$':
          dollar();
          break;
        case '~':
          w_.separate(' ');
          ++i_;
          break;
        case '&':
          w_.separate('\t');
          ++i_;
          break;
        case '#':
          ++i_;
          break;
        case '`':
          if (i_ + 1 < n && s_[i_ + 1] == '`') {
            w_.text("“");
            i_ += 2;
          } else {
            w_.text("‘");
            ++i_;
          }
          break;
        case '\'':
          if (i_ + 1 < n && s_[i_ + 1] == '\'') {
            w_.text("”");
            i_ += 2;
          } else {
            w_.text("'");
            ++i_;
          }
          break;
        case '-':
          dashes();
          break;
        case '\n':
          newline();
          break;
        case ' ':
        case '\t':
        case '\r':
        case '\f':
        case '\v':
          w_.separate(' ');
          ++i_;
          break;
        default:
          plain();
          break;
      }
    }
    return w_.finish();
  }

  bool composed() const { return marks_; }

 private:
  static bool special(char c) {
    static const std::array<bool, 256> table = [] {
      std::array<bool, 256> t{};
      for (char c : std::string_view("\\{}%$~&#`'-\n \t\r\f\v"))
        t[static_cast<unsigned char>(c)] = true;
      return t;
    }();
    return table[static_cast<unsigned char>(c)];
  }

  void plain() {
    size_t j = i_;
    while (j < s_.size() && !special(s_[j])) ++j;
    w_.text(s_.substr(i_, j - i_));
    i_ = j;
  }

  void dashes() {
    size_t j = i_;
    while (j < s_.size() && s_[j] == '-') ++j;
    size_t run = j - i_;
    std::string d;
    for (; run >= 3; run -= 3) d += "—";
    if (run == 2) d += "–";
    if (run == 1) d += "-";
    w_.text(d);
    i_ = j;
  }

  // A line break is a space; an empty line (only blanks on it) ends a paragraph.
  void newline() {
    size_t j = i_ + 1;
    bool blank = false;
    while (j < s_.size()) {
      char c = s_[j];
      if (c == '\n') {
        blank = true;
      } else if (c != ' ' && c != '\t' && c != '\r') {
        break;
      }
      ++j;
    }
    if (blank)
      w_.block(2);
    else
      w_.separate(' ');
    i_ = j;
  }

  // "%" to the end of the line, the line break and the next line's indent.
  void comment() {
    size_t e = s_.find('\n', i_);
    if (e == npos) {
      i_ = s_.size();
      return;
    }
    i_ = e + 1;
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }

  // Does a blank line start at the '\n' at k?
  bool blank_line_at(size_t k) const {
    size_t j = k + 1;
    while (j < s_.size() && (s_[j] == ' ' || s_[j] == '\t' || s_[j] == '\r')) ++j;
    return j < s_.size() && s_[j] == '\n';
  }

  // The next `needle` at or after `from` that is not escaped, before the end
  // of the paragraph; npos if none. Failures are remembered per needle, so a
  // paragraph full of unclosed openers is scanned once, not once per opener.
  size_t find_in_paragraph(size_t from, std::string_view needle, size_t& fail_limit) {
    if (from < fail_limit) return npos;
    size_t k = from;
    while (k < s_.size()) {
      if (s_[k] == '\n' && blank_line_at(k)) break;
      if (s_.compare(k, needle.size(), needle) == 0 &&
          (k == 0 || s_[k - 1] != '\\' || needle[0] == '\\'))
        return k;
      ++k;
    }
    fail_limit = k;
    return npos;
  }

  void dollar() {
    size_t n = s_.size();
    if (i_ + 1 < n && s_[i_ + 1] == '$') {  // display math: dropped
      size_t e = find_in_paragraph(i_ + 2, "$$", fail_display_);
      if (e == npos) {
        e = s_.find("$$", i_ + 2);  // display math may hold blank lines in sloppy sources
        if (e == npos) {
          i_ += 2;
          return;
        }
      }
      w_.separate(' ');
      i_ = e + 2;
      return;
    }
    size_t e = find_in_paragraph(i_ + 1, "$", fail_inline_);
    if (e == npos) {  // no closing $: a stray dollar sign
      w_.text("$");
      ++i_;
      return;
    }
    inline_math(i_, e + 1);
    i_ = e + 1;
  }

  // Inline math as written, its line breaks as spaces.
  void inline_math(size_t from, size_t to) {
    std::string m(s_.substr(from, to - from));
    for (char& c : m)
      if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    w_.text(m);
  }

  void skip_spaces() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }

  // At '{': the end of its content (the matching '}', escaped braces
  // skipped) and whether it was closed. An argument not closed by the end of
  // its paragraph ends there.
  std::pair<size_t, bool> group_end(size_t at) const {
    int depth = 0;
    size_t k = at;
    while (k < s_.size()) {
      char c = s_[k];
      if (c == '\\') {
        k += 2;
        continue;
      }
      if (c == '{') ++depth;
      if (c == '}' && --depth == 0) return {k, true};
      if (c == '\n' && blank_line_at(k)) return {k, false};
      ++k;
    }
    return {s_.size(), false};
  }

  // Skips [..] arguments right after the current position (spaces allowed).
  void skip_optional() {
    while (true) {
      size_t j = i_;
      while (j < s_.size() && (s_[j] == ' ' || s_[j] == '\t')) ++j;
      if (j >= s_.size() || s_[j] != '[') return;
      size_t e = find_in_paragraph(j + 1, "]", fail_bracket_);
      if (e == npos) return;
      i_ = e + 1;
    }
  }

  // The next argument: a {group} (returned without its braces), a control
  // sequence, or one character. Moves past it.
  std::string_view argument() {
    size_t j = i_;
    while (j < s_.size() && (s_[j] == ' ' || s_[j] == '\t' || s_[j] == '\n' || s_[j] == '\r')) ++j;
    if (j >= s_.size()) {
      i_ = j;
      return {};
    }
    if (s_[j] == '{') {
      auto [e, closed] = group_end(j);
      i_ = std::min(s_.size(), e + (closed ? 1 : 0));
      return s_.substr(j + 1, e - (j + 1));
    }
    if (s_[j] == '\\') {
      size_t k = j + 1;
      if (k < s_.size() && is_letter(s_[k])) {
        while (k < s_.size() && is_letter(s_[k])) ++k;
      } else {
        k = std::min(s_.size(), k + 1);
      }
      i_ = k;
      return s_.substr(j, k - j);
    }
    if (s_[j] == '}') {  // no argument
      i_ = j;
      return {};
    }
    size_t k = j + 1;
    while (k < s_.size() && (static_cast<unsigned char>(s_[k]) & 0xC0) == 0x80) ++k;
    i_ = k;
    return s_.substr(j, k - j);
  }

  void nested(std::string_view text) {
    if (nesting_ >= kMaxNesting) return;
    Converter inner(text, nesting_ + 1);
    std::string t = inner.run();
    marks_ |= inner.composed();
    for (char& c : t)
      if (c == '\n') c = ' ';
    w_.text(t);
  }

  void accent(std::string_view which) {
    std::string_view mark = combining_mark(which);
    std::string_view arg = argument();
    while (arg.size() >= 2 && arg.front() == '{' && arg.back() == '}')
      arg = arg.substr(1, arg.size() - 2);
    std::string base;
    if (arg == "\\i" || arg.substr(0, 3) == "\\i ")
      base = "i";
    else if (arg == "\\j")
      base = "j";
    else if (!arg.empty() && arg[0] != '\\') {
      size_t k = 1;
      while (k < arg.size() && (static_cast<unsigned char>(arg[k]) & 0xC0) == 0x80) ++k;
      base = std::string(arg.substr(0, k));
      if (k < arg.size()) {
        w_.text(base);
        w_.text(mark);
        marks_ = true;
        nested(arg.substr(k));
        return;
      }
    }
    if (base.empty()) {
      if (!arg.empty()) nested(arg);
      return;
    }
    w_.text(base + std::string(mark));
    marks_ = true;
  }

  void control() {
    size_t n = s_.size();
    if (i_ + 1 >= n) {
      ++i_;
      return;
    }
    char c = s_[i_ + 1];
    if (!is_letter(c)) {
      i_ += 2;
      switch (c) {
        case '\\':  // line break, with an optional * and [skip]
          if (i_ < n && s_[i_] == '*') ++i_;
          skip_optional();
          w_.block(1);
          return;
        case '%':
        case '&':
        case '$':
        case '#':
        case '_':
        case '{':
        case '}':
          w_.text(std::string_view(&s_[i_ - 1], 1));
          return;
        case ' ':
        case '\n':
        case '\t':
        case ',':
        case ';':
        case ':':
        case '>':
          w_.separate(' ');
          return;
        case '\'':
        case '`':
        case '^':
        case '"':
        case '~':
        case '=':
        case '.':
          accent(std::string_view(&s_[i_ - 1], 1));
          return;
        case '(': {
          size_t e = find_in_paragraph(i_, "\\)", fail_paren_);
          if (e == npos) return;
          inline_math(i_ - 2, e + 2);
          i_ = e + 2;
          return;
        }
        case '[': {
          size_t e = s_.find("\\]", i_);
          i_ = e == npos ? n : e + 2;
          w_.separate(' ');
          return;
        }
        default:  // \! \/ \@ \- and the like: nothing
          return;
      }
    }
    size_t j = i_ + 1;
    while (j < n && is_letter(s_[j])) ++j;
    std::string_view name = s_.substr(i_ + 1, j - i_ - 1);
    i_ = j;
    bool star = i_ < n && s_[i_] == '*';
    if (star) ++i_;
    word(name);
  }

  void word(std::string_view name) {
    if (const Named* sym = lookup(std::begin(kSymbols), std::end(kSymbols), name)) {
      w_.text(sym->value);
      if (i_ < s_.size() && s_[i_] == '{' && i_ + 1 < s_.size() && s_[i_ + 1] == '}') i_ += 2;
      return;
    }
    if (name.size() == 1 && !combining_mark(name).empty()) {
      accent(name);
      return;
    }
    if (std::find(std::begin(kSections), std::end(kSections), name) != std::end(kSections)) {
      skip_optional();
      skip_spaces();
      w_.block(2);
      if (i_ < s_.size() && s_[i_] == '{') {
        groups_.push_back('h');
        ++i_;
      }
      return;
    }
    if (const Dropped* d = lookup(std::begin(kDropped), std::end(kDropped), name)) {
      // "text~\cite{x}." reads "text.": the space before a dropped macro goes.
      w_.pending_sep = 0;
      for (int k = 0; k < d->args; ++k) {
        skip_optional();
        argument();
      }
      skip_optional();
      if (name == "bibitem") w_.block(2);
      if (name == "hspace") w_.separate(' ');
      return;
    }
    if (name == "begin") return begin_env();
    if (name == "end") return end_env();
    if (name == "item") return item();
    if (name == "par") return w_.block(2);
    if (name == "newline" || name == "linebreak") return w_.block(1);
    if (name == "newpage" || name == "clearpage" || name == "pagebreak") return w_.block(2);
    if (name == "quad" || name == "qquad" || name == "enspace" || name == "thinspace" ||
        name == "space" || name == "enskip" || name == "hfill" || name == "hfil")
      return w_.separate(' ');
    if (name == "verb") return verb();
    if (name == "url" || name == "path" || name == "nolinkurl") {
      w_.text(argument());
      return;
    }
    if (name == "newcommand" || name == "renewcommand" || name == "providecommand") {
      argument();  // the name
      skip_optional();
      argument();  // the body
      return;
    }
    if (name == "def" || name == "gdef" || name == "edef" || name == "xdef") {
      argument();                                                      // \name
      while (i_ < s_.size() && s_[i_] != '{' && s_[i_] != '\n') ++i_;  // #1#2
      argument();
      return;
    }
    // Anything else: the name goes, its optional arguments go, its brace
    // arguments are read as text.
    if (i_ < s_.size() && s_[i_] == '[') skip_optional();
  }

  void verb() {
    if (i_ >= s_.size()) return;
    char delim = s_[i_];
    size_t e = s_.find(delim, i_ + 1);
    size_t eol = s_.find('\n', i_ + 1);
    if (e == npos || (eol != npos && eol < e)) {  // not closed on its line
      e = eol == npos ? s_.size() : eol;
      w_.text(s_.substr(i_ + 1, e - i_ - 1));
      i_ = e;
      return;
    }
    w_.text(s_.substr(i_ + 1, e - i_ - 1));
    i_ = e + 1;
  }

  // {name} after \begin or \end; empty when malformed.
  std::string_view env_name() {
    size_t j = i_;
    while (j < s_.size() && (s_[j] == ' ' || s_[j] == '\t')) ++j;
    if (j >= s_.size() || s_[j] != '{') return {};
    size_t k = j + 1;
    while (k < s_.size() && k - j < 64 && (is_letter(s_[k]) || s_[k] == '*')) ++k;
    if (k >= s_.size() || s_[k] != '}') return {};
    i_ = k + 1;
    return s_.substr(j + 1, k - j - 1);
  }

  // The start of the \end{name} closing an environment whose body starts at
  // `from` (inner \begin{name} counted), or npos.
  size_t env_end(size_t from, std::string_view name) const {
    std::string open = "\\begin{" + std::string(name) + "}";
    std::string close = "\\end{" + std::string(name) + "}";
    int depth = 1;
    size_t k = from;
    while (true) {
      size_t e = s_.find(close, k);
      if (e == npos) return npos;
      for (size_t b = s_.find(open, k); b != npos && b < e; b = s_.find(open, b + open.size()))
        ++depth;
      if (--depth == 0) return e;
      k = e + close.size();
    }
  }

  void begin_env() {
    std::string_view name = env_name();
    if (name.empty() || name == "document") return;
    if (const DroppedEnv* d = lookup(std::begin(kDroppedEnvs), std::end(kDroppedEnvs), name)) {
      size_t e = env_end(i_, name);
      size_t body_end = e == npos ? s_.size() : e;
      // Display math stays inside its paragraph; floats stand apart.
      if (d->captions) {
        w_.block(2);
        captions(i_, body_end);
        w_.block(2);
      } else {
        w_.separate(' ');
      }
      i_ = e == npos ? s_.size() : e + name.size() + 6;
      return;
    }
    if (std::find(std::begin(kVerbatimEnvs), std::end(kVerbatimEnvs), name) !=
        std::end(kVerbatimEnvs)) {
      std::string close = "\\end{" + std::string(name) + "}";
      skip_optional();
      if (name == "minted") argument();  // the language
      // The body starts after \begin{..}, or on the next line when nothing follows.
      size_t start = i_;
      while (start < s_.size() && (s_[start] == ' ' || s_[start] == '\t' || s_[start] == '\r'))
        ++start;
      if (start < s_.size() && s_[start] == '\n')
        ++start;
      else
        start = i_;
      size_t e = s_.find(close, start);
      size_t body_end = e == npos ? s_.size() : e;
      w_.block(2);
      w_.raw(s_.substr(start, body_end - start));
      w_.block(2);
      i_ = e == npos ? s_.size() : e + close.size();
      return;
    }
    w_.block(2);
    skip_optional();
    if (name == "itemize" || name == "enumerate" || name == "description") {
      lists_.push_back({name[0], 0});
    } else if (name == "tabular" || name == "tabular*" || name == "array" || name == "longtable" ||
               name == "minipage" || name == "multicols" || name == "wrapfigure") {
      if (name == "tabular*") argument();
      argument();
    } else if (name == "tabularx") {
      argument();
      argument();
    }
  }

  void end_env() {
    std::string_view name = env_name();
    if (name.empty() || name == "document") return;
    if ((name == "itemize" || name == "enumerate" || name == "description") && !lists_.empty())
      lists_.pop_back();
    w_.block(2);
  }

  void item() {
    w_.block(1);
    char kind = lists_.empty() ? 'i' : lists_.back().kind;
    size_t j = i_;
    while (j < s_.size() && (s_[j] == ' ' || s_[j] == '\t')) ++j;
    if (j < s_.size() && s_[j] == '[') {
      size_t e = find_in_paragraph(j + 1, "]", fail_bracket_);
      if (e != npos) {
        nested(s_.substr(j + 1, e - j - 1));
        w_.text(kind == 'd' ? ":" : "");
        i_ = e + 1;
        w_.separate(' ');
        return;
      }
    }
    if (kind == 'e') {
      w_.text(std::to_string(++lists_.back().count) + ".");
    } else if (kind == 'i') {
      w_.text("-");
    } else {
      return;
    }
    w_.separate(' ');
  }

  // The \caption arguments in s_[from, to), each its own paragraph.
  void captions(size_t from, size_t to) {
    std::string_view body = s_.substr(from, to - from);
    for (size_t k = body.find("\\caption"); k != npos; k = body.find("\\caption", k + 8)) {
      size_t after = k + 8;
      if (after < body.size() && is_letter(body[after])) continue;  // \captionsetup
      Converter arg_reader(body, nesting_);
      arg_reader.i_ = after;
      arg_reader.skip_optional();
      std::string_view text = arg_reader.argument();
      w_.block(2);
      nested(text);
      w_.block(2);
      k = arg_reader.i_ > 8 ? arg_reader.i_ - 8 : k;
    }
  }

  struct List {
    char kind;  // 'i'temize, 'e'numerate, 'd'escription
    int count;
  };

  std::string_view s_;
  size_t i_ = 0;
  int nesting_;
  LatexWriter w_;
  std::vector<char> groups_;  // 'n' plain, 'h' section title
  std::vector<List> lists_;
  bool marks_ = false;  // combining marks written: the output needs NFC
  size_t fail_inline_ = 0, fail_display_ = 0, fail_paren_ = 0, fail_bracket_ = 0;
};

// The document body: between \begin{document} and \end{document} if present.
std::string_view body_of(std::string_view tex) {
  size_t b = tex.find("\\begin{document}");
  if (b == npos) return tex;
  tex = tex.substr(b + 16);
  size_t e = tex.find("\\end{document}");
  return e == npos ? tex : tex.substr(0, e);
}

}  // namespace

std::string latex_to_text(std::string_view tex) {
  Converter c(body_of(tex), 0);
  std::string out = c.run();
  if (c.composed()) out = nfc(out);
  return out;
}

}  // namespace nk::curate
