// HTML → the text of a page's main content, through gumbo's HTML5 parser.
//
// What goes: script/style/head and other non-content elements; navigation,
// headers, footers, sidebars and forms, found by tag (nav, aside, ...), ARIA
// role (navigation, banner, contentinfo, ...) or an id/class token such as
// "navbar", "sidebar", "cookie-banner"; hidden elements; and link-heavy blocks
// (menus, link lists), whose text is mostly anchor text.
// What stays: headings and paragraphs separated by a blank line; list items
// and table rows one per line (cells joined by a tab); <br> as a line break;
// <pre> verbatim. Inline elements join with HTML's whitespace rules, entities
// are decoded, and the result is valid UTF-8.
#pragma once
#include <string>
#include <string_view>

namespace nk::curate {

struct HtmlExtractOptions {
  // A block (paragraph, list item, cell) or container (list, table, div)
  // whose anchor text is more than this fraction of its text is dropped.
  double max_link_density = 0.75;
  // Drop elements whose id or class names boilerplate ("nav", "footer", ...).
  bool drop_boilerplate_classes = true;
};

// Time and memory are linear in the input (gumbo's tree plus the output).
std::string html_to_text(std::string_view html, const HtmlExtractOptions& opt = {});

}  // namespace nk::curate
