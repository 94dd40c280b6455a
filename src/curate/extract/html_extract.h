// HTML → the text of a page's main content, through gumbo's HTML5 parser.
//
// What goes: script/style/head and other non-content elements; navigation,
// headers, footers, sidebars and forms, found by tag (nav, aside, ...), ARIA
// role (navigation, banner, contentinfo, ...) or an id/class token such as
// "navbar", "sidebar", "cookie-banner"; hidden elements; and link-heavy blocks
// (menus, link lists), whose text is mostly anchor text. Link density is
// judged on lists and tables as a whole and on paragraphs and divs of running
// text, never on one list item or one cell of a data table (rows of two or
// more cells): a data table goes only when most of its rows have no text
// cell, so a column of package-name links stays in its rows; a list (or div)
// that text ending in ':' introduces ("For example:") is prose, judged only
// with the block around it.
// What stays: headings and paragraphs separated by a blank line; list items
// and table rows one per line (cells joined by a tab); <br> as a line break;
// <pre> verbatim. Inline elements join with HTML's whitespace rules, entities
// are decoded, and the result is valid UTF-8.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace nk::curate {

struct HtmlExtractOptions {
  // A paragraph or container (list, table, div) whose anchor text is more
  // than this fraction of its text is dropped (see above for which are judged).
  double max_link_density = 0.75;
  // Drop elements whose id or class names boilerplate ("nav", "footer", ...).
  bool drop_boilerplate_classes = true;
};

// What the link-density rule did on one page (the html_to_text stage's
// counters link_dense_blocks_dropped, link_dense_tables_kept and
// link_dense_lists_kept).
struct HtmlExtractStats {
  int64_t link_blocks_dropped = 0;  // blocks and containers dropped as link-dense
  int64_t link_tables_kept = 0;     // link-dense data tables kept: their rows have text cells
  int64_t link_lists_kept = 0;      // link-dense lists and divs kept: text ending in ':' before
};

// Time and memory are linear in the input (gumbo's tree plus the output).
std::string html_to_text(std::string_view html, const HtmlExtractOptions& opt = {},
                         HtmlExtractStats* stats = nullptr);

}  // namespace nk::curate
