// LaTeX source → plain prose, by a single forward scan (no macro expansion).
//
// Kept: the body between \begin{document} and \end{document} (the whole input
// when there is none); section titles (\part … \subparagraph) as lines of
// their own; the text of formatting macros (\textbf{x} → x) and of any unknown
// macro's brace arguments; list items one per line ("- " or "1. "); figure and
// table captions; inline math verbatim ($x^2$, \(x\)); verbatim environments
// and \verb as written.
// Dropped: comments (% up to the end of the line, not \%); citations,
// references, labels, footnotes, index entries, URLs' link targets and other
// bookkeeping macros with their arguments; figure and table bodies; display
// math ($$…$$, \[…\], equation, align, …); the bibliography; macro
// definitions.
// Rewritten: \\ → newline, ~ → space, accents (\'e → é, \"o → ö, \c{c} → ç),
// -- → –, --- → —, `` → “, '' → ”, ` → ‘ (a single ' stays an apostrophe),
// \ldots → …, escaped specials (\% \& \$ \# \_ \{ \}) → the character.
// Unbalanced braces or environments never stop it: an argument that is not
// closed ends at the next blank line, an environment that is not closed at the
// end of the input. Time is linear in the input.
#pragma once
#include <string>
#include <string_view>

namespace nk::curate {

// Paragraphs separated by "\n\n", NFC-normalised UTF-8.
std::string latex_to_text(std::string_view tex);

}  // namespace nk::curate
