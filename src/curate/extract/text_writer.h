// Text output shared by the HTML and LaTeX extractors: source whitespace is
// collapsed to one separator, block boundaries become "\n" or "\n\n" (never
// more), and lines never end in spaces.
#pragma once
#include <algorithm>
#include <string>

namespace nk::curate {

struct ParagraphWriter {
  std::string out;
  int pending_break = 0;  // 0, 1 ("\n") or 2 ("\n\n") before the next text
  char pending_sep = 0;   // ' ' or '\t' before the next text on the same line

  // A block boundary of `level` (1: line break, 2: paragraph) before the next text.
  void block(int level) {
    pending_break = std::max(pending_break, level);
    pending_sep = 0;
  }
  // A separator before the next text on the same line (a tab wins over a space).
  void separate(char c) {
    if (c == '\t' || !pending_sep) pending_sep = c;
  }
  // Writes what is pending; called before each piece of text.
  void flush() {
    if (out.empty()) {
      pending_break = 0;
      pending_sep = 0;
      return;
    }
    if (pending_break) {
      while (!out.empty() && (out.back() == ' ' || out.back() == '\t')) out.pop_back();
      size_t nl = 0;
      for (size_t k = out.size(); k > 0 && out[k - 1] == '\n' && nl < 2; --k) ++nl;
      for (int k = int(nl); k < pending_break; ++k) out.push_back('\n');
    } else if (pending_sep && out.back() != '\n' && out.back() != ' ' && out.back() != '\t') {
      out.push_back(pending_sep);
    }
    pending_break = 0;
    pending_sep = 0;
  }
};

}  // namespace nk::curate
