#include "curate/extract/html_extract.h"
#include "curate/extract/text_writer.h"

#include <fmt/format.h>
#include <gumbo.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "curate/extract/latex_extract.h"
#include "curate/stages.h"
#include "curate/words.h"

namespace nk::curate {

namespace {

// ---------------------------------------------------------------------------
// Nesting guard. gumbo's tree construction checks "element in scope" by
// walking the stack of open elements, so a page of a million unclosed <div>s
// costs depth × tags: minutes. Pages nested deeper than kMaxDepth (real pages
// stay far below 100) are parsed with the over-deep start tags removed, which
// keeps every character of text and bounds the cost.

constexpr int kMaxDepth = 400;

inline char lower(char c) {
  return (c >= 'A' && c <= 'Z') ? char(c + 32) : c;
}
inline bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// Tags that never stay open under later siblings: void elements and those
// whose end tag is implied (an unclosed <p> or <li> is closed by the next).
bool never_nests(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "area", "base",  "br",     "col",    "embed",    "hr",    "img",   "input", "link",
      "meta", "param", "source", "track",  "wbr",      "p",     "li",    "dt",    "dd",
      "tr",   "td",    "th",     "option", "optgroup", "tbody", "thead", "tfoot", "colgroup",
      "html", "head",  "body",   "rb",     "rt",       "rp",    "frame", "keygen"};
  for (std::string_view n : kNames)
    if (n == name) return true;
  return false;
}

bool is_raw_text(std::string_view name) {
  return name == "script" || name == "style" || name == "textarea" || name == "title" ||
         name == "xmp" || name == "iframe" || name == "noembed" || name == "noframes";
}

// Position after the first case-insensitive "</name" at or after i (or n).
size_t skip_raw_text(std::string_view s, size_t i, std::string_view name) {
  while (true) {
    size_t lt = s.find("</", i);
    if (lt == std::string_view::npos) return s.size();
    size_t k = 0;
    while (k < name.size() && lt + 2 + k < s.size() && lower(s[lt + 2 + k]) == name[k]) ++k;
    if (k == name.size()) return lt;
    i = lt + 2;
  }
}

// Scans the tags of `html`; when `out` is given, copies the input into it
// without the start tags that would open an element deeper than kMaxDepth.
// Returns the deepest nesting seen (an estimate: it ignores implied end tags
// of the elements never_nests() does not list).
int scan_depth(std::string_view s, std::string* out) {
  int depth = 0, deepest = 0;
  size_t i = 0, copied = 0, n = s.size();
  char name[16];
  while (i < n) {
    const void* p = std::memchr(s.data() + i, '<', n - i);
    if (!p) break;
    size_t lt = size_t(static_cast<const char*>(p) - s.data());
    i = lt + 1;
    if (i >= n) break;
    if (s.compare(i, 3, "!--") == 0) {
      size_t e = s.find("-->", i + 3);
      i = e == std::string_view::npos ? n : e + 3;
      continue;
    }
    bool end_tag = s[i] == '/';
    size_t j = i + (end_tag ? 1 : 0);
    if (j >= n || !is_alpha(s[j])) continue;
    size_t len = 0;
    while (j < n && (is_alpha(s[j]) || (s[j] >= '0' && s[j] <= '9'))) {
      if (len < sizeof(name)) name[len] = lower(s[j]);
      ++len, ++j;
    }
    std::string_view tag(name, std::min(len, sizeof(name)));
    // The end of the tag, stepping over quoted attribute values.
    char quote = 0;
    while (j < n && (quote || s[j] != '>')) {
      if (quote) {
        if (s[j] == quote) quote = 0;
      } else if (s[j] == '"' || s[j] == '\'') {
        quote = s[j];
      }
      ++j;
    }
    size_t gt = j;
    i = std::min(n, gt + 1);
    if (end_tag) {
      if (!never_nests(tag) && depth > 0) --depth;
      continue;
    }
    bool self_closing = gt < n && gt > lt && s[gt - 1] == '/';
    if (is_raw_text(tag)) {
      i = skip_raw_text(s, i, tag);
      continue;
    }
    if (self_closing || never_nests(tag)) continue;
    if (depth >= kMaxDepth) {
      if (out) {
        out->append(s.data() + copied, lt - copied);
        copied = i;
      }
      deepest = depth + 1;
      continue;
    }
    deepest = std::max(deepest, ++depth);
  }
  if (out) out->append(s.data() + copied, n - copied);
  return deepest;
}

// ---------------------------------------------------------------------------
// Output with HTML's whitespace rules: runs of spaces inside a block become
// one space, block boundaries become "\n" or "\n\n", nothing trails.

struct HtmlWriter : ParagraphWriter {
  int64_t chars = 0;  // non-space bytes written, and those inside <a href>
  int64_t link_chars = 0;
  int link_depth = 0;
  int pre_depth = 0;
  void count(int64_t n) {
    chars += n;
    if (link_depth) link_chars += n;
  }
  static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
  }
  void text(std::string_view t) {
    if (pre_depth) {
      if (t.empty()) return;
      flush();
      out.append(t);
      int64_t n = 0;
      for (char c : t) n += !is_space(c) && (static_cast<unsigned char>(c) & 0xC0) != 0x80;
      count(n);
      return;
    }
    size_t i = 0;
    while (i < t.size()) {
      if (is_space(t[i])) {
        separate(' ');
        ++i;
        continue;
      }
      size_t j = i;
      int64_t n = 0;
      while (j < t.size() && !is_space(t[j])) {
        n += (static_cast<unsigned char>(t[j]) & 0xC0) != 0x80;
        ++j;
      }
      flush();
      out.append(t.data() + i, j - i);
      count(n);
      i = j;
    }
  }
};

// ---------------------------------------------------------------------------
// What each element is.

bool is_block(GumboTag t) {
  switch (t) {
    case GUMBO_TAG_ADDRESS:
    case GUMBO_TAG_ARTICLE:
    case GUMBO_TAG_BLOCKQUOTE:
    case GUMBO_TAG_BODY:
    case GUMBO_TAG_CAPTION:
    case GUMBO_TAG_CENTER:
    case GUMBO_TAG_DD:
    case GUMBO_TAG_DETAILS:
    case GUMBO_TAG_DIR:
    case GUMBO_TAG_DIV:
    case GUMBO_TAG_DL:
    case GUMBO_TAG_DT:
    case GUMBO_TAG_FIELDSET:
    case GUMBO_TAG_FIGCAPTION:
    case GUMBO_TAG_FIGURE:
    case GUMBO_TAG_H1:
    case GUMBO_TAG_H2:
    case GUMBO_TAG_H3:
    case GUMBO_TAG_H4:
    case GUMBO_TAG_H5:
    case GUMBO_TAG_H6:
    case GUMBO_TAG_HEADER:
    case GUMBO_TAG_HGROUP:
    case GUMBO_TAG_HR:
    case GUMBO_TAG_HTML:
    case GUMBO_TAG_LEGEND:
    case GUMBO_TAG_LI:
    case GUMBO_TAG_LISTING:
    case GUMBO_TAG_MAIN:
    case GUMBO_TAG_MENU:
    case GUMBO_TAG_OL:
    case GUMBO_TAG_P:
    case GUMBO_TAG_PRE:
    case GUMBO_TAG_SECTION:
    case GUMBO_TAG_SUMMARY:
    case GUMBO_TAG_TABLE:
    case GUMBO_TAG_TBODY:
    case GUMBO_TAG_TD:
    case GUMBO_TAG_TFOOT:
    case GUMBO_TAG_TH:
    case GUMBO_TAG_THEAD:
    case GUMBO_TAG_TR:
    case GUMBO_TAG_UL:
    case GUMBO_TAG_XMP:
    case GUMBO_TAG_PLAINTEXT:
      return true;
    default:
      return false;
  }
}

bool is_dropped_tag(GumboTag t) {
  switch (t) {
    case GUMBO_TAG_HEAD:
    case GUMBO_TAG_TITLE:
    case GUMBO_TAG_SCRIPT:
    case GUMBO_TAG_STYLE:
    case GUMBO_TAG_NOSCRIPT:
    case GUMBO_TAG_TEMPLATE:
    case GUMBO_TAG_SVG:
    case GUMBO_TAG_MATH:
    case GUMBO_TAG_NAV:
    case GUMBO_TAG_FOOTER:
    case GUMBO_TAG_ASIDE:
    case GUMBO_TAG_FORM:
    case GUMBO_TAG_BUTTON:
    case GUMBO_TAG_SELECT:
    case GUMBO_TAG_OPTION:
    case GUMBO_TAG_TEXTAREA:
    case GUMBO_TAG_INPUT:
    case GUMBO_TAG_LABEL:
    case GUMBO_TAG_IFRAME:
    case GUMBO_TAG_FRAMESET:
    case GUMBO_TAG_OBJECT:
    case GUMBO_TAG_EMBED:
    case GUMBO_TAG_APPLET:
    case GUMBO_TAG_CANVAS:
    case GUMBO_TAG_AUDIO:
    case GUMBO_TAG_VIDEO:
    case GUMBO_TAG_MAP:
    case GUMBO_TAG_MENUITEM:
    case GUMBO_TAG_IMG:
    case GUMBO_TAG_NOEMBED:
    case GUMBO_TAG_NOFRAMES:
    case GUMBO_TAG_DATALIST:
    case GUMBO_TAG_KEYGEN:
      return true;
    default:
      return false;
  }
}

// Where link density is judged (the rest of the rule is in Extractor::judged):
// lists and tables as a whole, since a menu is a list or table of links; a
// paragraph or div in running text on its own. A list item is judged with its
// list (a short link-labelled item inside content stays), and a data table's
// rows and cells with their table, so that its package-name column does not
// vanish from its rows.
bool is_list(GumboTag t) {
  return t == GUMBO_TAG_UL || t == GUMBO_TAG_OL || t == GUMBO_TAG_DL || t == GUMBO_TAG_MENU ||
         t == GUMBO_TAG_DIR;
}
bool is_list_item(GumboTag t) {
  return t == GUMBO_TAG_LI || t == GUMBO_TAG_DT || t == GUMBO_TAG_DD;
}
bool is_cell(GumboTag t) {
  return t == GUMBO_TAG_TD || t == GUMBO_TAG_TH;
}

// Whole id/class tokens and the '-'/'_'-separated parts of tokens that mark
// page furniture ("main-nav", "cookie_banner", "sphinxsidebar"; DocBook's
// "navheader" and "navfooter", the previous/next tables of its manuals).
constexpr std::string_view kBoilerplateParts[] = {
    "nav",           "navbar",    "navigation",  "menu",       "menubar",     "sidebar",
    "sphinxsidebar", "footer",    "header",      "breadcrumb", "breadcrumbs", "related",
    "cookie",        "cookies",   "consent",     "banner",     "advert",      "advertisement",
    "ads",           "ad",        "adsbygoogle", "share",      "sharing",     "social",
    "skiplink",      "popup",     "newsletter",  "masthead",   "toolbar",     "pagination",
    "pager",         "sponsored", "promo",       "topbar",     "navbox",      "navheader",
    "navfooter"};

bool is_boilerplate_part(std::string_view part) {
  for (std::string_view b : kBoilerplateParts)
    if (b == part) return true;
  return false;
}

// `max_parts`: tokens of more parts are only matched whole; ids made from a
// heading ("edit-menu-shell-and-editor") are prose, not a role.
bool names_boilerplate(const char* value, size_t max_parts) {
  // Lower-cased, split at spaces into tokens and tokens into parts.
  char buf[64];
  const char* p = value;
  while (*p) {
    while (*p == ' ' || *p == '\t' || *p == '\n') ++p;
    const char* tok = p;
    while (*p && *p != ' ' && *p != '\t' && *p != '\n') ++p;
    size_t len = size_t(p - tok);
    if (len == 0 || len >= sizeof(buf)) continue;
    for (size_t k = 0; k < len; ++k) buf[k] = lower(tok[k]);
    std::string_view token(buf, len);
    // "toc" (a table of contents: DocBook, MediaWiki) only whole: Sphinx's
    // "toc-backref" is a heading's own link.
    if (token == "skip-link" || token == "skip-to-content" || token == "toc" ||
        is_boilerplate_part(token))
      return true;
    size_t parts = 1;
    for (size_t k = 0; k < len; ++k) parts += token[k] == '-' || token[k] == '_';
    if (parts > max_parts) continue;
    size_t start = 0;
    for (size_t k = 0; k <= len; ++k) {
      if (k == len || token[k] == '-' || token[k] == '_') {
        if (k > start && is_boilerplate_part(token.substr(start, k - start))) return true;
        start = k + 1;
      }
    }
  }
  return false;
}

// The attributes the extractor looks at, found in one pass (gumbo lower-cases
// attribute names).
struct Attrs {
  const char *id = nullptr, *cls = nullptr, *role = nullptr, *style = nullptr;
  const char *href = nullptr, *aria_hidden = nullptr;
  bool hidden = false;

  explicit Attrs(const GumboElement& e) {
    for (unsigned k = 0; k < e.attributes.length; ++k) {
      const auto* a = static_cast<const GumboAttribute*>(e.attributes.data[k]);
      const char* n = a->name;
      switch (n[0]) {
        case 'i':
          if (std::strcmp(n, "id") == 0) id = a->value;
          break;
        case 'c':
          if (std::strcmp(n, "class") == 0) cls = a->value;
          break;
        case 'r':
          if (std::strcmp(n, "role") == 0) role = a->value;
          break;
        case 's':
          if (std::strcmp(n, "style") == 0) style = a->value;
          break;
        case 'h':
          if (std::strcmp(n, "href") == 0)
            href = a->value;
          else if (std::strcmp(n, "hidden") == 0)
            hidden = true;
          break;
        case 'a':
          if (std::strcmp(n, "aria-hidden") == 0) aria_hidden = a->value;
          break;
        default:
          break;
      }
    }
  }
};

bool contains_ci(const char* hay, std::string_view needle) {
  size_t n = std::strlen(hay);
  for (size_t i = 0; i + needle.size() <= n; ++i) {
    size_t k = 0;
    while (k < needle.size() && lower(hay[i + k]) == needle[k]) ++k;
    if (k == needle.size()) return true;
  }
  return false;
}

bool is_hidden(const Attrs& a) {
  if (a.hidden) return true;
  if (a.aria_hidden && contains_ci(a.aria_hidden, "true")) return true;
  if (a.style) {
    std::string s;
    for (const char* c = a.style; *c; ++c)
      if (*c != ' ') s.push_back(lower(*c));
    if (s.find("display:none") != std::string::npos ||
        s.find("visibility:hidden") != std::string::npos)
      return true;
  }
  return false;
}

bool is_boilerplate_role(const char* role) {
  static constexpr std::string_view kRoles[] = {"navigation",    "banner", "contentinfo",
                                                "complementary", "search", "menu",
                                                "menubar",       "dialog", "alertdialog"};
  std::string r;
  for (const char* c = role; *c; ++c) r.push_back(lower(*c));
  for (std::string_view k : kRoles)
    if (r == k) return true;
  return false;
}

bool lower_equals(const char* s, std::string_view lower_word) {
  size_t n = std::strlen(s);
  if (n != lower_word.size()) return false;
  for (size_t i = 0; i < n; ++i)
    if (lower(s[i]) != lower_word[i]) return false;
  return true;
}

bool is_heading(GumboTag t) {
  return t == GUMBO_TAG_H1 || t == GUMBO_TAG_H2 || t == GUMBO_TAG_H3 || t == GUMBO_TAG_H4 ||
         t == GUMBO_TAG_H5 || t == GUMBO_TAG_H6;
}

const GumboVector& kids_of(const GumboNode* n) {
  return n->v.element.children;
}
GumboTag tag_of(const GumboNode* n) {
  return n->type == GUMBO_NODE_ELEMENT ? n->v.element.tag : GUMBO_TAG_UNKNOWN;
}

// A data table, as opposed to a layout table: at least two rows of two or
// more cells, no cell holding a table or a heading of its own (a page laid
// out in a table) and no role="presentation". Looks at the table's own rows
// and its cells' children only, so every node is looked at by one table:
// linear in the page.
bool is_data_table(const GumboNode* table, const char* role) {
  if (role && (lower_equals(role, "presentation") || lower_equals(role, "none"))) return false;
  int rows_of_cells = 0;
  auto row = [&](const GumboNode* tr) {
    int cells = 0;
    const GumboVector& tk = kids_of(tr);
    for (unsigned k = 0; k < tk.length; ++k) {
      const auto* cell = static_cast<const GumboNode*>(tk.data[k]);
      if (!is_cell(tag_of(cell))) continue;
      ++cells;
      const GumboVector& ck = kids_of(cell);
      for (unsigned m = 0; m < ck.length; ++m) {
        GumboTag t = tag_of(static_cast<const GumboNode*>(ck.data[m]));
        if (t == GUMBO_TAG_TABLE || is_heading(t)) return false;
      }
    }
    rows_of_cells += cells >= 2;
    return true;
  };
  const GumboVector& kids = kids_of(table);
  for (unsigned i = 0; i < kids.length; ++i) {
    const auto* c = static_cast<const GumboNode*>(kids.data[i]);
    GumboTag t = tag_of(c);
    if (t == GUMBO_TAG_TR) {
      if (!row(c)) return false;
    } else if (t == GUMBO_TAG_TBODY || t == GUMBO_TAG_THEAD || t == GUMBO_TAG_TFOOT) {
      const GumboVector& rk = kids_of(c);
      for (unsigned j = 0; j < rk.length; ++j) {
        const auto* tr = static_cast<const GumboNode*>(rk.data[j]);
        if (tag_of(tr) == GUMBO_TAG_TR && !row(tr)) return false;
      }
    }
  }
  return rows_of_cells >= 2;
}

// ---------------------------------------------------------------------------
// The walk: iterative (no recursion, whatever the depth), emitting into the
// HtmlWriter; an element remembers where its output began so that it can take
// it back when it is judged link-dense (and a cell, to measure itself).

struct Frame {
  const GumboNode* node;
  unsigned child = 0;
  // State at entry, for the link-density rollback.
  size_t out_size = 0;
  int64_t chars = 0, link_chars = 0;
  int pending_break = 0;
  char pending_sep = 0;
  bool link = false;        // an <a href>
  bool judged = false;      // dropped at its end when link-dense
  bool introduced = false;  // a list or div after text ending in ':' (kept)
  bool data = false;        // a data table (is_data_table)
  // A table's rows with a non-empty <td>, and those of them that also have a
  // text cell (a non-empty cell that is not link-dense); the open row's flags.
  int rows = 0, text_rows = 0;
  bool row_td = false, row_text = false;
};

class Extractor {
 public:
  explicit Extractor(const HtmlExtractOptions& opt) : opt_(opt) {}

  std::string run(const GumboNode* root) {
    w_ = HtmlWriter{};
    w_.out.reserve(4096);
    stack_.clear();
    tables_.clear();
    stats_ = HtmlExtractStats{};
    enter(root);
    while (!stack_.empty()) {
      Frame& f = stack_.back();
      const GumboVector* kids = children(f.node);
      if (kids && f.child < kids->length) {
        const GumboNode* c = static_cast<const GumboNode*>(kids->data[f.child++]);
        enter(c);
        continue;
      }
      leave();
    }
    w_.pending_break = 0;
    w_.flush();
    std::string out = std::move(w_.out);
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ' || out.back() == '\t'))
      out.pop_back();
    return out;
  }

  const HtmlExtractStats& stats() const { return stats_; }

 private:
  static const GumboVector* children(const GumboNode* n) {
    if (n->type == GUMBO_NODE_DOCUMENT) return &n->v.document.children;
    if (n->type == GUMBO_NODE_ELEMENT) return &n->v.element.children;
    return nullptr;
  }

  bool skip(const GumboElement& e, const Attrs& a) const {
    GumboTag t = e.tag;
    if (is_dropped_tag(t)) return true;
    if (t == GUMBO_TAG_HEADER && article_depth_ == 0) return true;
    if (t == GUMBO_TAG_HTML || t == GUMBO_TAG_BODY) return false;
    if (is_hidden(a)) return true;
    if (a.role && is_boilerplate_role(a.role)) return true;
    if (opt_.drop_boilerplate_classes && t != GUMBO_TAG_MAIN && t != GUMBO_TAG_ARTICLE) {
      // Section ids are usually made from their heading: only classes count.
      if (a.id && t != GUMBO_TAG_SECTION && names_boilerplate(a.id, 3)) return true;
      if (a.cls && names_boilerplate(a.cls, 8)) return true;
    }
    return false;
  }

  bool dense(int64_t chars, int64_t links) const {
    return chars > 0 && double(links) > opt_.max_link_density * double(chars);
  }

  // Whether the text written so far ends in a colon (ASCII or full-width):
  // "For example:" before a list of linked names makes it part of the prose.
  // Looks back over at most 64 spaces (a <pre> may end in any number).
  bool after_colon() const {
    const std::string& o = w_.out;
    size_t i = o.size(), stop = o.size() > 64 ? o.size() - 64 : 0;
    while (i > stop && HtmlWriter::is_space(o[i - 1])) --i;
    if (i > 0 && o[i - 1] == ':') return true;
    return i >= 3 && o.compare(i - 3, 3, "\xEF\xBC\x9A") == 0;  // U+FF1A
  }

  // Whether `t`, entered now, is judged on its own link density. Lists are
  // judged as a whole wherever they are (a list of links is a menu) unless
  // running text introduces them ("For example:", see leave()); list items
  // never on their own (a short link-labelled item stays with its list). A
  // data table is judged as a whole (see leave()), nothing inside it but
  // lists; a layout table, its rows and cells each, as any container. A
  // paragraph or div only in running text: inside a list item or a data
  // table its list or table judges it.
  bool judged(GumboTag t) const {
    if (is_list(t)) return true;
    if (data_depth_ > 0) return false;
    switch (t) {
      case GUMBO_TAG_TABLE:
      case GUMBO_TAG_TR:
      case GUMBO_TAG_TD:
      case GUMBO_TAG_TH:
        return true;
      case GUMBO_TAG_P:
      case GUMBO_TAG_DIV:
        return item_depth_ == 0;
      default:
        return false;
    }
  }

  // Break level before and after a block element.
  int break_level(GumboTag t) const {
    switch (t) {
      case GUMBO_TAG_TD:  // cells share their row's line
      case GUMBO_TAG_TH:
        return 0;
      case GUMBO_TAG_LI:
      case GUMBO_TAG_TR:
      case GUMBO_TAG_DT:
      case GUMBO_TAG_DD:
      case GUMBO_TAG_CAPTION:
      case GUMBO_TAG_SUMMARY:
      case GUMBO_TAG_LEGEND:
        return 1;
      case GUMBO_TAG_P:
      case GUMBO_TAG_DIV:
      case GUMBO_TAG_UL:
      case GUMBO_TAG_OL:
      case GUMBO_TAG_DL:
        return list_depth_ > 0 ? 1 : 2;
      default:
        return 2;
    }
  }

  void enter(const GumboNode* n) {
    switch (n->type) {
      case GUMBO_NODE_TEXT:
      case GUMBO_NODE_WHITESPACE:
      case GUMBO_NODE_CDATA:
        w_.text(n->v.text.text);
        return;
      case GUMBO_NODE_DOCUMENT:
        stack_.push_back(Frame{n});
        return;
      case GUMBO_NODE_ELEMENT:
        break;
      default:  // comments, templates
        return;
    }
    const GumboElement& e = n->v.element;
    Attrs a(e);
    if (skip(e, a)) {
      if (is_block(e.tag)) w_.block(break_level(e.tag));
      return;
    }
    GumboTag t = e.tag;
    if (t == GUMBO_TAG_BR) {
      w_.block(1);
      return;
    }
    if (t == GUMBO_TAG_HR) {
      w_.block(2);
      return;
    }
    Frame f{n};
    if (is_block(t)) w_.block(break_level(t));
    if ((t == GUMBO_TAG_TD || t == GUMBO_TAG_TH) && n->index_within_parent > 0) w_.separate('\t');
    f.out_size = w_.out.size();
    f.chars = w_.chars;
    f.link_chars = w_.link_chars;
    f.pending_break = w_.pending_break;
    f.pending_sep = w_.pending_sep;
    if (t == GUMBO_TAG_TABLE) f.data = is_data_table(n, a.role);
    f.judged = judged(t);
    f.introduced = f.judged && (is_list(t) || t == GUMBO_TAG_DIV) && after_colon();
    if (t == GUMBO_TAG_TABLE) {
      tables_.push_back(stack_.size());  // the index f gets below
      data_depth_ += f.data;
    } else if (t == GUMBO_TAG_TR && !tables_.empty()) {
      Frame& table = stack_[tables_.back()];
      table.row_td = table.row_text = false;
    }
    if (is_list_item(t)) ++item_depth_;
    if (t == GUMBO_TAG_A && a.href) {
      ++w_.link_depth;
      f.link = true;
    }
    if (t == GUMBO_TAG_PRE || t == GUMBO_TAG_LISTING || t == GUMBO_TAG_XMP ||
        t == GUMBO_TAG_PLAINTEXT)
      ++w_.pre_depth;
    if (t == GUMBO_TAG_UL || t == GUMBO_TAG_OL || t == GUMBO_TAG_DL || t == GUMBO_TAG_TABLE)
      ++list_depth_;
    if (t == GUMBO_TAG_ARTICLE || t == GUMBO_TAG_MAIN) ++article_depth_;
    stack_.push_back(f);
  }

  void leave() {
    Frame f = stack_.back();
    stack_.pop_back();
    if (f.node->type != GUMBO_NODE_ELEMENT) return;
    GumboTag t = f.node->v.element.tag;
    if (f.link) --w_.link_depth;
    if (t == GUMBO_TAG_PRE || t == GUMBO_TAG_LISTING || t == GUMBO_TAG_XMP ||
        t == GUMBO_TAG_PLAINTEXT)
      --w_.pre_depth;
    if (t == GUMBO_TAG_UL || t == GUMBO_TAG_OL || t == GUMBO_TAG_DL || t == GUMBO_TAG_TABLE)
      --list_depth_;
    if (t == GUMBO_TAG_ARTICLE || t == GUMBO_TAG_MAIN) --article_depth_;
    if (is_list_item(t)) --item_depth_;
    int64_t chars = w_.chars - f.chars, links = w_.link_chars - f.link_chars;
    // A cell and a row tell their table what they hold (before any rollback).
    if (!tables_.empty() && (is_cell(t) || t == GUMBO_TAG_TR)) {
      Frame& table = stack_[tables_.back()];
      if (t == GUMBO_TAG_TR) {
        table.rows += table.row_td;
        table.text_rows += table.row_td && table.row_text;
      } else if (chars > 0) {
        table.row_td |= t == GUMBO_TAG_TD;
        table.row_text |= !dense(chars, links);
      }
    }
    if (t == GUMBO_TAG_TABLE) {
      tables_.pop_back();
      data_depth_ -= f.data;
    }
    if (f.judged && dense(chars, links)) {
      // A data table goes only when it is a table of links: most of its rows
      // (with a <td>) have no text cell. Rows that mix link cells (a package
      // name, a version) and text cells (a description) are data.
      if (f.data && f.rows > 0 && 2 * f.text_rows >= f.rows) {
        ++stats_.link_tables_kept;
      } else if (f.introduced) {
        ++stats_.link_lists_kept;
      } else {
        w_.out.resize(f.out_size);
        w_.chars = f.chars;
        w_.link_chars = f.link_chars;
        w_.pending_break = f.pending_break;
        w_.pending_sep = f.pending_sep;
        ++stats_.link_blocks_dropped;
      }
    }
    // A kept data table is content to the blocks around it: its link text no
    // longer counts against them (a div holding only the table stays too).
    if (f.data && w_.link_depth == 0) w_.link_chars = f.link_chars;
    if (is_block(t)) w_.block(break_level(t));
  }

  const HtmlExtractOptions& opt_;
  HtmlWriter w_;
  std::vector<Frame> stack_;
  std::vector<size_t> tables_;  // indices in stack_ of the open tables
  HtmlExtractStats stats_;
  int list_depth_ = 0;
  int data_depth_ = 0;  // open data tables
  int item_depth_ = 0;  // open list items (li, dt, dd)
  int article_depth_ = 0;
};

struct OutputDeleter {
  void operator()(GumboOutput* o) const { gumbo_destroy_output(&kGumboDefaultOptions, o); }
};

}  // namespace

std::string html_to_text(std::string_view html, const HtmlExtractOptions& opt,
                         HtmlExtractStats* stats) {
  if (stats) *stats = HtmlExtractStats{};
  if (html.empty()) return {};
  std::string shallow;
  if (scan_depth(html, nullptr) > kMaxDepth) {
    shallow.reserve(html.size());
    scan_depth(html, &shallow);
    html = shallow;
  }
  GumboOptions go = kGumboDefaultOptions;
  go.max_errors = 0;  // keep no parse errors: a broken page would fill memory with them
  std::unique_ptr<GumboOutput, OutputDeleter> doc(
      gumbo_parse_with_options(&go, html.data(), html.size()));
  if (!doc) return {};
  Extractor ex(opt);
  std::string text = ex.run(doc->document);
  if (stats) *stats = ex.stats();
  return text;
}

// ---------------------------------------------------------------------------
// The stages html_to_text and latex_to_text.

namespace {

// Converts documents whose meta "format" is `format` or absent.
class ExtractStage : public DocStage {
 public:
  using Convert = std::string (*)(std::string_view, const HtmlExtractOptions&, HtmlExtractStats*);
  ExtractStage(std::string format, std::string label, Convert convert, HtmlExtractOptions opt,
               int64_t min_chars)
      : format_(std::move(format)),
        label_(std::move(label)),
        convert_(convert),
        opt_(opt),
        min_chars_(min_chars) {}

  Verdict apply(Document& doc, Counters& counts) const override {
    auto f = doc.meta.find("format");
    if (f != doc.meta.end() && !(f->is_string() && f->get<std::string>() == format_))
      return Verdict::kept();
    HtmlExtractStats st;
    doc.text = convert_(doc.text, opt_, &st);
    counts["extracted"] += 1;
    if (st.link_blocks_dropped) counts["link_dense_blocks_dropped"] += st.link_blocks_dropped;
    if (st.link_tables_kept) counts["link_dense_tables_kept"] += st.link_tables_kept;
    if (st.link_lists_kept) counts["link_dense_lists_kept"] += st.link_lists_kept;
    if (doc.text.empty()) return Verdict::removed("no text extracted from " + label_);
    if (min_chars_ > 1) {
      int64_t n = int64_t(utf8_length(doc.text));
      if (n < min_chars_)
        return Verdict::removed(
            fmt::format("extracted text has {} characters < min_chars {}", n, min_chars_));
    }
    return Verdict::kept();
  }

 private:
  std::string format_, label_;
  Convert convert_;
  HtmlExtractOptions opt_;
  int64_t min_chars_;
};

std::string convert_html(std::string_view s, const HtmlExtractOptions& o, HtmlExtractStats* st) {
  return html_to_text(s, o, st);
}
std::string convert_latex(std::string_view s, const HtmlExtractOptions&, HtmlExtractStats*) {
  return latex_to_text(s);
}

int64_t read_min_chars(StageConfig& c) {
  int64_t m = 1;
  c.bind("min_chars", m, "remove documents whose extracted text has fewer code points");
  if (m < 1) c.fail_key("min_chars", fmt::format("must be at least 1, got {}", m));
  return m;
}

}  // namespace

void register_extract_stages(StageRegistry& r) {
  r.add({"html_to_text",
         "HTML → main-content text (boilerplate, navigation and link lists dropped)",
         [](StageConfig& c) -> std::unique_ptr<DocStage> {
           HtmlExtractOptions o;
           c.bind("max_link_density", o.max_link_density,
                  "drop blocks whose anchor text is more than this fraction of their text");
           if (!(o.max_link_density >= 0 && o.max_link_density <= 1))
             c.fail_key("max_link_density", "must be between 0 and 1");
           c.bind("drop_boilerplate_classes", o.drop_boilerplate_classes,
                  "drop elements whose id or class names boilerplate (nav, footer, ...)");
           int64_t m = read_min_chars(c);
           return std::make_unique<ExtractStage>("html", "HTML", convert_html, o, m);
         },
         nullptr});
  r.add({"latex_to_text", "LaTeX source → prose (math, figures, citations dropped)",
         [](StageConfig& c) -> std::unique_ptr<DocStage> {
           int64_t m = read_min_chars(c);
           return std::make_unique<ExtractStage>("latex", "LaTeX", convert_latex,
                                                 HtmlExtractOptions{}, m);
         },
         nullptr});
}

}  // namespace nk::curate
