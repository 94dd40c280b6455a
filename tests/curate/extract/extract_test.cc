#include <gtest/gtest.h>
#include <gumbo.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "curate/extract/html_extract.h"
#include "curate/extract/latex_extract.h"
#include "curate/stages.h"
#include "curate/words.h"
#include "test_util.h"

#include "curate/stage_util.h"

namespace nk::curate {
namespace {

namespace fs = std::filesystem;
using test::contains;

// ---------------------------------------------------------------------------
// HTML, rule by rule.

std::string H(const std::string& html) {
  return html_to_text(html);
}

TEST(ExtractHtml, ParagraphsHeadingsAndInlineSpacing) {
  EXPECT_EQ(H("<h1>Title</h1><p>Hello <b>bold</b> world</p><p>Second</p>"),
            "Title\n\nHello bold world\n\nSecond");
  EXPECT_EQ(H("<p>a<span>b</span>c <i>d</i></p>"), "abc d");
  EXPECT_EQ(H("<p>  spread \n\t over   lines  </p>"), "spread over lines");
  EXPECT_EQ(H("<div>one<div>two</div>three</div>"), "one\n\ntwo\n\nthree");
  EXPECT_EQ(H("<span>inline</span><p>block</p>tail"), "inline\n\nblock\n\ntail");
  EXPECT_EQ(H("<p>line one<br>line two<br/><br>after</p>"), "line one\nline two\nafter");
  EXPECT_EQ(H("<p>before</p><hr><p>after</p>"), "before\n\nafter");
  EXPECT_EQ(H("plain text, no tags"), "plain text, no tags");
}

TEST(ExtractHtml, EntitiesAreDecoded) {
  EXPECT_EQ(H("<p>&lt;tag&gt; &amp; caf&eacute; &#x4E2D;&#25991; &#8212; a&nbsp;b</p>"),
            "<tag> & café 中文 — a\u00A0b");
  EXPECT_EQ(H("<p>&zzzz; &amp</p>"), "&zzzz; &");
  EXPECT_EQ(H("<p>&notit;</p>"), "¬it;");  // HTML5: legacy entities need no ';'
}

TEST(ExtractHtml, ListsTablesAndPre) {
  EXPECT_EQ(H("<p>Intro</p><ul><li>one</li><li>two <b>2</b></li><li><p>para</p></li></ul><p>End"),
            "Intro\n\none\ntwo 2\npara\n\nEnd");
  EXPECT_EQ(H("<ol><li>a<ul><li>nested</li></ul></li><li>b</li></ol>"), "a\nnested\nb");
  EXPECT_EQ(
      H("<table><tr><th>name</th><th>value</th></tr>\n<tr><td>x</td> <td>1</td></tr></table>"),
      "name\tvalue\nx\t1");
  EXPECT_EQ(H("<p>code:</p><pre>def f():\n    <span>return</span>  1\n</pre><p>after</p>"),
            "code:\n\ndef f():\n    return  1\n\nafter");
  EXPECT_EQ(H("<dl><dt>term</dt><dd>meaning</dd></dl>"), "term\nmeaning");
}

TEST(ExtractHtml, NonContentElementsAreDropped) {
  EXPECT_EQ(H("<html><head><title>T</title><style>p{}</style><script>var x=1;</script></head>"
              "<body><noscript>enable js</noscript><template><p>tpl</p></template>"
              "<svg><text>svgtext</text></svg><p>Body</p><form><label>Name</label>"
              "<input value=v><button>Go</button><select><option>opt</option></select></form>"
              "<iframe src=x>frame</iframe></body></html>"),
            "Body");
  EXPECT_EQ(H("<nav>menu</nav><header>site</header><aside>side</aside><main><p>Main</p></main>"
              "<footer>foot</footer>"),
            "Main");
  // A header inside an article holds its title.
  EXPECT_EQ(H("<article><header><h1>Post</h1></header><p>Text</p></article>"), "Post\n\nText");
}

TEST(ExtractHtml, BoilerplateByClassIdRoleAndVisibility) {
  const char* dropped[] = {
      "<div class='main-nav'>x</div>",
      "<div class='toc'>x</div>",
      "<div class='navheader'>x</div>",
      "<div id='cookie-banner'>x</div>",
      "<div class='sphinxsidebar'>x</div>",
      "<div class='foo Footer'>x</div>",
      "<div class='related'>x</div>",
      "<ul class='breadcrumb'><li>x</li></ul>",
      "<div class='share_buttons'>x</div>",
      "<a class='skip-link' href='#m'>x</a>",
      "<div role='navigation'>x</div>",
      "<div role='contentinfo'>x</div>",
      "<div hidden>x</div>",
      "<div style='display: none'>x</div>",
      "<div aria-hidden='true'>x</div>",
      "<div class='ad-slot'>x</div>",
  };
  for (const char* d : dropped) EXPECT_EQ(H(std::string("<p>keep</p>") + d), "keep") << d;
  // Words that only contain a boilerplate token, long heading-made ids and
  // sections' ids are content.
  const char* kept[] = {
      "<div class='navigator-guide'>x</div>",
      "<div class='download'>x</div>",
      "<div class='loaded'>x</div>",
      "<div id='edit-menu-shell-and-editor'>x</div>",
      "<section id='menu'>x</section>",
      "<div class='headerlink-free'>x</div>",
      "<h2><a class='toc-backref' href='#id1'>x</a></h2>",
  };
  for (const char* k : kept) EXPECT_EQ(H(std::string("<p>keep</p>") + k), "keep\n\nx") << k;
}

TEST(ExtractHtml, LinkHeavyBlocksAreDropped) {
  EXPECT_EQ(H("<ul><li><a href='/'>Home</a></li><li><a href='/a'>About us</a></li></ul>"
              "<p>Real text with <a href='x'>one link</a> inside it.</p>"),
            "Real text with one link inside it.");
  // The threshold (0.75 of the non-space characters): 12 of 16 stays, 13 of 17 goes.
  EXPECT_EQ(H("<p>aaaa <a href='x'>bbbbbbbbbbbb</a></p>"), "aaaa bbbbbbbbbbbb");
  EXPECT_EQ(H("<p>aaaa <a href='x'>bbbbbbbbbbbbb</a></p>"), "");
  // An anchor without href is not a link.
  EXPECT_EQ(H("<p><a name='x'>anchor text</a></p>"), "anchor text");
  HtmlExtractOptions keep_links;
  keep_links.max_link_density = 1.0;
  EXPECT_EQ(html_to_text("<p><a href='x'>all link</a></p>", keep_links), "all link");
  HtmlExtractOptions no_classes;
  no_classes.drop_boilerplate_classes = false;
  EXPECT_EQ(html_to_text("<div class='sidebar'>side</div>", no_classes), "side");
}

// Link density is judged on lists and tables as a whole, never on one cell
// of a data table: Debian Reference's package tables link the name, popcon
// and size of each package, and judging cell by cell took those columns out
// of every row (issue 15).
TEST(ExtractHtml, DataTablesKeepTheirLinkCells) {
  const std::string packages =
      "<table>"
      "<tr><td><a href='p/less'>less</a></td><td><a href='q/less'>V:262, I:999</a></td>"
      "<td><a href='s/less'>289</a></td><td>pager</td></tr>"
      "<tr><td><a href='p/most'>most</a></td><td><a href='q/most'>V:1, I:7</a></td>"
      "<td><a href='s/most'>200</a></td><td>a pager</td></tr>"
      "<tr><td><a href='p/pv'>pv</a></td><td><a href='q/pv'>V:4, I:62</a></td>"
      "<td><a href='s/pv'>42</a></td><td><a href='m/pv'>See pv(1)</a></td></tr></table>";
  HtmlExtractStats st;
  // Most of it is link text (0.79), but every row but one has a text cell.
  EXPECT_EQ(html_to_text(packages, {}, &st),
            "less\tV:262, I:999\t289\tpager\n"
            "most\tV:1, I:7\t200\ta pager\n"
            "pv\tV:4, I:62\t42\tSee pv(1)");
  EXPECT_EQ(st.link_tables_kept, 1);
  EXPECT_EQ(st.link_blocks_dropped, 0);
  // A wrapper around the kept table does not take it back either.
  EXPECT_TRUE(contains(H("<div>" + packages + "</div>"), "less\tV:262, I:999\t289\tpager"));
  // A header row, cells holding paragraphs (DocBook's informal tables; a
  // paragraph is a line of its own, as everywhere).
  EXPECT_EQ(H("<table><thead><tr><th>package</th><th>description</th></tr></thead><tbody>"
              "<tr><td><p><a href='p/mc'>mc</a></p></td><td><p><a href='s/mc'>See 1.3</a></p></td>"
              "</tr><tr><td><a href='p/vim'>vim</a></td><td>an editor</td></tr></tbody></table>"),
            "package\tdescription\n\nmc\nSee 1.3\nvim\tan editor");
  // A table of links only is a menu; so is a layout table's column of links,
  // judged cell by cell as before (one row: not a data table).
  EXPECT_EQ(html_to_text("<table><tr><td><a href='/a'>About</a></td><td><a href='/b'>Contact</a>"
                         "</td></tr><tr><td><a href='/c'>Privacy</a></td><td><a href='/d'>Terms"
                         "</a></td></tr></table><p>Body.</p>",
                         {}, &st),
            "Body.");
  EXPECT_EQ(st.link_blocks_dropped, 1);
  EXPECT_EQ(st.link_tables_kept, 0);
  EXPECT_EQ(H("<table><tr><td><a href='/'>Home</a><br><a href='/news'>News</a></td>"
              "<td><p>The article sits in the second cell.</p></td></tr></table>"),
            "The article sits in the second cell.");
  // Two rows of two cells, but one cell holds a table of its own: a layout.
  EXPECT_EQ(H("<table><tr><td><a href='/'>Home</a></td><td>Site</td></tr><tr>"
              "<td><a href='/news'>News</a></td><td><table><tr><td>Inner text</td></tr></table>"
              "</td></tr></table>"),
            "Site\n\nInner text");
}

// A list is judged as a whole, not item by item: a short link-labelled item
// among text items stays, and so does a list of links that the running text
// introduces with a colon; a list of links on its own is still a menu.
TEST(ExtractHtml, ListsAreJudgedAsAWhole) {
  EXPECT_EQ(H("<ul><li>Open the file in an editor,</li><li><a href='https://www.vim.org/'>Vim"
              "</a></li><li>then save it and restart the daemon.</li></ul>"),
            "Open the file in an editor,\nVim\nthen save it and restart the daemon.");
  HtmlExtractStats st;
  EXPECT_EQ(html_to_text("<p>The LSM framework hosts, for example:</p><div><ul>"
                         "<li><p><a href='https://en.wikipedia.org/wiki/AppArmor'>AppArmor</a></p>"
                         "</li><li><p><a href='https://en.wikipedia.org/wiki/SELinux'>SELinux</a>"
                         "</p></li></ul></div><p>Each tightens the model.</p>",
                         {}, &st),
            "The LSM framework hosts, for example:\n\nAppArmor\nSELinux\n\nEach tightens the "
            "model.");
  EXPECT_EQ(st.link_lists_kept, 2);  // the list and the div around it
  EXPECT_EQ(H("<p>全文如下：</p><ul><li><a href='a'>第一章</a></li></ul>"), "全文如下：\n\n第一章");
  EXPECT_EQ(H("<p>Some text.</p><ul><li><a href='/a'>Home</a></li><li><a href='/b'>Blog</a></li>"
              "</ul>"),
            "Some text.");
  // Introduced, but inside a block of links: the block still goes.
  EXPECT_EQ(H("<p>Body text of the page.</p><div><a href='/f'>Follow us</a>: <ul><li>"
              "<a href='/t'>Mastodon</a></li><li><a href='/r'>RSS</a></li></ul></div>"),
            "Body text of the page.");
}

// A page with the usual furniture: only the article and its data table stay.
TEST(ExtractHtml, MenusAndFootersStillGoAroundDataTables) {
  const std::string page =
      "<html><body><div id='top'><ul><li><a href='/'>Home</a></li><li><a href='/docs'>Docs</a>"
      "</li><li><a href='/blog'>Blog</a></li></ul></div>"
      "<div class='navheader'><table><tr><th colspan='3'>Chapter 9. System tips</th></tr><tr>"
      "<td><a href='ch08.html'>Prev</a></td><td></td><td><a href='ch10.html'>Next</a></td></tr>"
      "</table></div>"
      "<div class='toc'><p><strong>Table of Contents</strong></p><dl><dt><a href='#s1'>9.1. The"
      " console tips</a></dt><dt><a href='#s2'>9.2. Customizing vim</a></dt></dl></div>"
      "<h1>9.1. The console tips</h1><p>These packages help at the console.</p>"
      "<table><thead><tr><th>package</th><th>popcon</th><th>description</th></tr></thead><tbody>"
      "<tr><td><a href='p/mc'>mc</a></td><td><a href='q/mc'>V:54</a></td><td>See <a href='#mc'>"
      "Section 1.3</a></td></tr><tr><td><a href='p/screen'>screen</a></td><td><a href='q/s'>"
      "V:71</a></td><td>terminal multiplexer</td></tr></tbody></table>"
      "<div class='navfooter'><table><tr><td><a href='ch08.html'>Prev</a></td><td></td>"
      "<td><a href='ch10.html'>Next</a></td></tr><tr><td>Chapter 8. I18N</td><td><a href="
      "'index.html'>Home</a></td><td>Chapter 10. Data management</td></tr></table></div>"
      "<table><tr><td><a href='/a'>About</a></td><td><a href='/c'>Contact</a></td></tr><tr><td>"
      "<a href='/p'>Privacy</a></td><td><a href='/t'>Terms</a></td></tr></table>"
      "<div class='site-footer'>Copyright 2024 Example. <a href='/imprint'>Imprint</a></div>"
      "</body></html>";
  EXPECT_EQ(H(page),
            "9.1. The console tips\n\nThese packages help at the console.\n\n"
            "package\tpopcon\tdescription\n\nmc\tV:54\tSee Section 1.3\n"
            "screen\tV:71\tterminal multiplexer");
}

TEST(ExtractHtml, BadInputNeverBreaksIt) {
  EXPECT_EQ(H(""), "");
  EXPECT_EQ(H("<html></html>"), "");
  EXPECT_EQ(H("<div><p>unclosed <b>bold <i>both"), "unclosed bold both");
  EXPECT_EQ(H("</p></div>stray</b> end tags"), "stray end tags");
  EXPECT_EQ(H("<<<>>> <a b=<c> <!-- never closed"), "<<<>>>");
  EXPECT_EQ(H("a \xEF\xBF\xBD b"), "a \xEF\xBF\xBD b");
  // Random bytes: valid UTF-8 out, no crash.
  std::mt19937 rng(7);
  const std::string alphabet = "<>/=\"' abp!-&;#x\n\xC3\xA9";
  for (int round = 0; round < 200; ++round) {
    std::string s;
    for (int k = 0; k < 300; ++k) s += alphabet[rng() % alphabet.size()];
    std::string out = H(s);
    EXPECT_EQ(out.find('\0'), std::string::npos);
  }
}

TEST(ExtractHtml, DeepNestingAndBigPagesStayFast) {
  auto t0 = std::chrono::steady_clock::now();
  // 200k unclosed <div>s: quadratic inside gumbo without the depth guard.
  std::string deep;
  for (int k = 0; k < 200000; ++k) deep += "<div>";
  deep += "deep text";
  EXPECT_EQ(H(deep), "deep text");
  std::string spans;
  for (int k = 0; k < 50000; ++k) spans += "<span><b>";
  spans += "inside";
  EXPECT_EQ(H(spans), "inside");
  // Tests assert no wall-clock time: a quadratic path would hang until the
  // per-test timeout (600 s) instead.
  std::printf("html_to_text, 250k nested tags: %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  // A 4 MB page: every paragraph comes out.
  std::string big = "<html><body>";
  for (int k = 0; k < 40000; ++k)
    big += "<p>Paragraph number " + std::to_string(k) +
           " has some <b>bold</b> words and an <a href='#'>anchor</a> in it, right.</p>\n";
  t0 = std::chrono::steady_clock::now();
  std::string out = H(big);
  double big_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(contains(out, "Paragraph number 39999 has some bold words"));
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2 * 39999);
  std::printf("html_to_text: %.1f MB in %.2f s (%.1f MB/s)\n", double(big.size()) / 1e6, big_s,
              double(big.size()) / 1e6 / big_s);
}

// ---------------------------------------------------------------------------
// LaTeX, rule by rule.

std::string L(const std::string& tex) {
  return latex_to_text(tex);
}

TEST(ExtractLatex, PreambleCommentsAndSections) {
  EXPECT_EQ(L("\\documentclass{article}\n\\usepackage{x}\n\\title{T}\n\\begin{document}\n"
              "\\section{Intro}\\label{s}\nBody text.\n\\end{document}\nafter end"),
            "Intro\n\nBody text.");
  EXPECT_EQ(L("no document env, % comment\nnext line"), "no document env, next line");
  EXPECT_EQ(L("50\\% off % the rest goes\nkept"), "50% off kept");
  EXPECT_EQ(L("join%\n   ed"), "joined");
  EXPECT_EQ(L("\\chapter{C}\\subsection*{Sub}\\subsubsection[short]{Long title}\n"
              "\\paragraph{Para} Text."),
            "C\n\nSub\n\nLong title\n\nPara\n\nText.");
}

TEST(ExtractLatex, FormattingAndUnknownMacros) {
  EXPECT_EQ(L("A \\textbf{bold}, \\emph{em} and \\textit{it} word."), "A bold, em and it word.");
  EXPECT_EQ(L("\\textbf{a {b {c}} d}e"), "a b c de");
  EXPECT_EQ(L("\\mymacro{kept} \\other[opt]{arg} \\noarg text"), "kept arg text");
  EXPECT_EQ(L("{\\bf group} \\LaTeX{} and \\TeX"), "group LaTeX and TeX");
  EXPECT_EQ(L("\\href{http://x}{the link} \\url{http://a_b.c/~d}"), "the link http://a_b.c/~d");
  EXPECT_EQ(L("\\verb|x_{1}| and \\verb+a%b+"), "x_{1} and a%b");
}

TEST(ExtractLatex, CitationsReferencesFootnotesAreDropped) {
  EXPECT_EQ(L("as shown~\\cite{knuth}. See \\citep[p.~3]{a,b} and Fig.~\\ref{f}\\label{x}."),
            "as shown. See and Fig..");
  EXPECT_EQ(L("Text\\footnote{a note with {braces}} continues.\\index{term}"), "Text continues.");
}

TEST(ExtractLatex, CharactersAccentsQuotesDashes) {
  EXPECT_EQ(L("Caf\\'e na\\\"ive gar\\c{c}on \\'{\\i}ndice \\v{S}koda \\ss{} \\o"),
            "Café naïve garçon índice Škoda ß ø");
  EXPECT_EQ(L("\\`a \\^o \\~n \\={a} \\H{o} \\r{a} \\u{g} \\k{a}"), "à ô ñ ā ő å ğ ą");
  EXPECT_EQ(L("``double'' `single' it's"), "“double” ‘single' it's");
  EXPECT_EQ(L("1--2, yes---no, well-known"), "1–2, yes—no, well-known");
  EXPECT_EQ(L("non~breaking \\& \\$5 \\#1 a\\_b \\{x\\} \\ldots"),
            "non breaking & $5 #1 a_b {x} …");
  EXPECT_EQ(L("line one\\\\line two\\\\[2pt]three"), "line one\nline two\nthree");
}

TEST(ExtractLatex, ListsFloatsAndMath) {
  EXPECT_EQ(L("\\begin{itemize}\n\\item First\n\\item Second\n\\end{itemize}"),
            "- First\n- Second");
  EXPECT_EQ(L("\\begin{enumerate}\\item One \\item Two\\end{enumerate}"), "1. One\n2. Two");
  EXPECT_EQ(L("\\begin{description}\\item[Key] value\\end{description}"), "Key: value");
  EXPECT_EQ(L("Before.\n\\begin{figure}[t]\\centering\\includegraphics[width=2cm]{f.pdf}\n"
              "\\caption{A \\emph{nice} plot.}\\label{f}\\end{figure}\nAfter."),
            "Before.\n\nA nice plot.\n\nAfter.");
  EXPECT_EQ(L("\\begin{table}\\begin{tabular}{ll} a & b \\\\ \\end{tabular}\\end{table}Next"),
            "Next");
  EXPECT_EQ(L("Inline $x^2 + y$ and \\(a_1\\) stay."), "Inline $x^2 + y$ and \\(a_1\\) stay.");
  EXPECT_EQ(L("We have \\begin{equation} E = mc^2 \\end{equation} so \\[ a \\] and $$ b $$ end."),
            "We have so and end.");
  EXPECT_EQ(L("\\begin{align*} x &= 1 \\\\ y &= 2 \\end{align*}Done"), "Done");
  EXPECT_EQ(L("Code:\n\\begin{verbatim}\n  x  = {1}  % not a comment\n\\end{verbatim}\nAfter"),
            "Code:\n\n  x  = {1}  % not a comment\n\nAfter");
  EXPECT_EQ(L("\\begin{abstract}Short.\\end{abstract}\\begin{theorem}[Name] T.\\end{theorem}"),
            "Short.\n\nT.");
}

TEST(ExtractLatex, UnbalancedInputNeverBreaksIt) {
  EXPECT_EQ(L(""), "");
  EXPECT_EQ(L("}}} stray {{ closing"), "stray closing");
  EXPECT_EQ(L("\\textbf{never closed\n\nnext paragraph"), "never closed\n\nnext paragraph");
  EXPECT_EQ(L("\\cite{open\n\nsurvives"), "survives");
  EXPECT_EQ(L("a $ lone dollar\n\nb"), "a $ lone dollar\n\nb");
  EXPECT_EQ(L("kept \\begin{equation} never closed"), "kept");
  EXPECT_EQ(L("\\end{itemize} \\item x \\begin{"), "- x");
  EXPECT_EQ(L("trailing backslash \\"), "trailing backslash");
  EXPECT_EQ(L("\\'"), "");
  std::mt19937 rng(11);
  const std::string alphabet = "\\{}[]$%&~`'-\n abeginditemcsv*()^_";
  for (int round = 0; round < 500; ++round) {
    std::string s;
    for (int k = 0; k < 200; ++k) s += alphabet[rng() % alphabet.size()];
    std::string out = L(s);  // must return
    EXPECT_EQ(out.find('\0'), std::string::npos);
  }
}

TEST(ExtractLatex, PathologicalInputsStayLinear) {
  // Each opener would scan to the end of its paragraph if failures were not
  // remembered: 1 MB of them would take minutes.
  const char* openers[] = {"\\(", "[", "$$ ", "\\cite{", "{", "\\verb|", "\\begin{figure}"};
  for (const char* o : openers) {
    std::string s = "\\foo";
    while (s.size() < 1000000) s += o;
    (void)L(s);  // a quadratic scan would hang until the test timeout
  }
  std::string paper;
  for (int k = 0; k < 20000; ++k)
    paper += "\\section{S" + std::to_string(k) + "} Some \\emph{text} with $x_" +
             std::to_string(k) + "$ and~\\cite{r" + std::to_string(k) + "}.\n\n";
  auto t0 = std::chrono::steady_clock::now();
  std::string out = L(paper);
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(contains(out, "S19999\n\nSome text with $x_19999$ and."));
  std::printf("latex_to_text: %.1f MB in %.3f s\n", double(paper.size()) / 1e6, sec);
}

// ---------------------------------------------------------------------------
// The stages.

TEST(ExtractStages, HtmlToTextFollowsTheFormat) {
  auto s = test_stage::make_stage("type: html_to_text");
  Counters counts;
  Document d{"a", "<p>Hi <b>there</b></p>"};
  EXPECT_TRUE(s->apply(d, counts).keep);
  EXPECT_EQ(d.text, "Hi there");
  Document html{"b", "<p>x</p>"};
  html.meta["format"] = "html";
  EXPECT_TRUE(s->apply(html, counts).keep);
  EXPECT_EQ(html.text, "x");
  Document tex{"c", "<p>left alone</p>"};
  tex.meta["format"] = "latex";
  EXPECT_TRUE(s->apply(tex, counts).keep);
  EXPECT_EQ(tex.text, "<p>left alone</p>");
  Document empty{"d", "<script>x()</script><nav>menu</nav>"};
  Verdict v = s->apply(empty, counts);
  EXPECT_FALSE(v.keep);
  EXPECT_EQ(v.reason, "no text extracted from HTML");
  EXPECT_EQ(counts["extracted"], 3);

  // The link-density rule's counters.
  Counters links;
  Document menu{"g",
                "<p>Text.</p><ul><li><a href='/'>Home</a></li></ul><p>Such as:</p><ul><li>"
                "<a href='a'>A</a></li></ul><table><tr><td><a href='x'>x</a></td><td>text "
                "</td></tr><tr><td><a href='yyyyyyyyyyyyyyyyyy'>yyyyyyyyyyyyyyyyyy</a></td>"
                "<td>t</td></tr></table>"};
  EXPECT_TRUE(s->apply(menu, links).keep);
  EXPECT_EQ(menu.text, "Text.\n\nSuch as:\n\nA\n\nx\ttext\nyyyyyyyyyyyyyyyyyy\tt");
  EXPECT_EQ(links["link_dense_blocks_dropped"], 1);
  EXPECT_EQ(links["link_dense_lists_kept"], 1);
  EXPECT_EQ(links["link_dense_tables_kept"], 1);

  auto min = test_stage::make_stage("type: html_to_text\nmin_chars: 5");
  Document shortdoc{"e", "<p>abcd</p>"}, ok{"f", "<p>abcde</p>"};
  v = min->apply(shortdoc, counts);
  EXPECT_FALSE(v.keep);
  EXPECT_EQ(v.reason, "extracted text has 4 characters < min_chars 5");
  EXPECT_TRUE(min->apply(ok, counts).keep);
}

TEST(ExtractStages, LatexToTextFollowsTheFormat) {
  auto s = test_stage::make_stage("type: latex_to_text");
  Counters counts;
  Document d{"a", "\\section{T}Body"};
  EXPECT_TRUE(s->apply(d, counts).keep);
  EXPECT_EQ(d.text, "T\n\nBody");
  Document html{"b", "\\emph{x}"};
  html.meta["format"] = "html";
  EXPECT_TRUE(s->apply(html, counts).keep);
  EXPECT_EQ(html.text, "\\emph{x}");
  Document empty{"c", "\\begin{equation}x\\end{equation}% only math"};
  Verdict v = s->apply(empty, counts);
  EXPECT_FALSE(v.keep);
  EXPECT_EQ(v.reason, "no text extracted from LaTeX");
}

TEST(ExtractStages, BadSettingsNameTheKey) {
  std::string e =
      test::error_of([] { test_stage::make_stage("type: html_to_text\nmax_link_density: 2"); });
  EXPECT_TRUE(contains(e, "pipeline.yaml:2: stage 1 (html_to_text): key 'max_link_density'")) << e;
  e = test::error_of([] { test_stage::make_stage("type: latex_to_text\nmin_chars: 0"); });
  EXPECT_TRUE(contains(e, "key 'min_chars': must be at least 1")) << e;
  e = test::error_of([] { test_stage::make_stage("type: html_to_text\nmin_char: 3"); });
  EXPECT_TRUE(contains(e, "unknown key 'min_char'")) << e;
}

// ---------------------------------------------------------------------------
// Extraction measured on real pages: Python's HTML documentation against the
// reStructuredText each page was built from.

constexpr const char* kPyDocs = "/usr/share/doc/python3.11/html";

using Bag = std::unordered_map<std::string, int64_t>;

Bag bag_of(std::string_view text) {
  Bag b;
  for (std::string_view w : words_of(text)) {
    std::string t(w);
    for (char& c : t)
      if (c >= 'A' && c <= 'Z') c = char(c + 32);
    ++b[t];
  }
  return b;
}

struct Overlap {
  int64_t extracted = 0, source = 0, common = 0;
};

Overlap overlap(const Bag& got, const Bag& want) {
  Overlap o;
  for (const auto& [w, n] : got) o.extracted += n;
  for (const auto& [w, n] : want) {
    o.source += n;
    auto it = got.find(w);
    if (it != got.end()) o.common += std::min(n, it->second);
  }
  return o;
}

TEST(ExtractPythonDocs, TokenF1AgainstTheSourceText) {
  // A missing reference is a broken set-up: fail, never skip.
  if (!fs::exists(fs::path(kPyDocs) / "_sources"))
    GTEST_FAIL() << "Debian's python3.11-doc is missing (" << kPyDocs
                 << "/_sources): run scripts/setup.sh --test, which installs it";
  std::vector<std::pair<std::string, std::string>> pages;  // html, source
  for (const auto& e : fs::recursive_directory_iterator(kPyDocs)) {
    if (!e.is_regular_file() || e.path().extension() != ".html") continue;
    fs::path rel = fs::relative(e.path(), kPyDocs);
    fs::path src = fs::path(kPyDocs) / "_sources" / rel;
    src.replace_extension(".rst.txt");
    if (fs::exists(src)) pages.emplace_back(e.path().string(), src.string());
  }
  std::sort(pages.begin(), pages.end());
  ASSERT_GE(pages.size(), 400u);
  std::vector<Overlap> per(pages.size());
  std::vector<double> mb(2, 0), secs(2, 0);
  auto work = [&](size_t t, size_t nt) {
    for (size_t k = t; k < pages.size(); k += nt) {
      std::string html = test::read_file(pages[k].first);
      auto t0 = std::chrono::steady_clock::now();
      std::string text = html_to_text(html);
      secs[t] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      mb[t] += double(html.size()) / 1e6;
      per[k] = overlap(bag_of(text), bag_of(test::read_file(pages[k].second)));
    }
  };
  std::thread other(work, 1, 2);
  work(0, 2);
  other.join();
  Overlap all;
  for (const Overlap& o : per) {
    all.extracted += o.extracted;
    all.source += o.source;
    all.common += o.common;
  }
  double p = double(all.common) / double(all.extracted),
         r = double(all.common) / double(all.source);
  double f1 = 2 * p * r / (p + r);
  std::printf(
      "python3.11-doc: %zu pages, %.1f MB of HTML at %.1f MB/s per thread; "
      "token precision %.4f recall %.4f F1 %.4f\n",
      pages.size(), mb[0] + mb[1], (mb[0] + mb[1]) / (secs[0] + secs[1]), p, r, f1);
  if (getenv("NK_EXTRACT_WORST")) {  // the pages that lose most, to study
    std::vector<size_t> idx(pages.size());
    for (size_t k = 0; k < idx.size(); ++k) idx[k] = k;
    auto loss = [&](size_t k) {
      return double(per[k].extracted - per[k].common) + double(per[k].source - per[k].common);
    };
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return loss(a) > loss(b); });
    for (size_t k = 0; k < 25 && k < idx.size(); ++k) {
      const Overlap& o = per[idx[k]];
      std::printf("  %s extracted %ld source %ld common %ld\n", pages[idx[k]].first.c_str(),
                  long(o.extracted), long(o.source), long(o.common));
    }
  }
  EXPECT_GE(f1, 0.9);
}

// ---------------------------------------------------------------------------
// Extraction measured on Debian Reference (debian-reference-en), whose tables
// of packages link each package's name, popcon and size: against a naive
// extraction, every text node of the page but those of script and style.

constexpr const char* kDebianReference = "/usr/share/debian-reference";

bool is_inline_tag(GumboTag t) {
  switch (t) {
    case GUMBO_TAG_A:
    case GUMBO_TAG_B:
    case GUMBO_TAG_I:
    case GUMBO_TAG_EM:
    case GUMBO_TAG_STRONG:
    case GUMBO_TAG_CODE:
    case GUMBO_TAG_SPAN:
    case GUMBO_TAG_SUP:
    case GUMBO_TAG_SUB:
    case GUMBO_TAG_SMALL:
    case GUMBO_TAG_TT:
    case GUMBO_TAG_KBD:
    case GUMBO_TAG_VAR:
    case GUMBO_TAG_SAMP:
    case GUMBO_TAG_ABBR:
    case GUMBO_TAG_ACRONYM:
    case GUMBO_TAG_CITE:
    case GUMBO_TAG_Q:
    case GUMBO_TAG_U:
    case GUMBO_TAG_S:
    case GUMBO_TAG_FONT:
      return true;
    default:
      return false;
  }
}

// DocBook's navigation: the table of contents and the previous/next tables.
bool is_docbook_navigation(const GumboElement& e) {
  for (unsigned k = 0; k < e.attributes.length; ++k) {
    const auto* a = static_cast<const GumboAttribute*>(e.attributes.data[k]);
    if (std::string_view(a->name) == "class") {
      std::string_view v = a->value;
      return v == "toc" || v == "navheader" || v == "navfooter";
    }
  }
  return false;
}

// The naive extraction: all text, a space after each element that is not
// inline. With `content_only`, without DocBook's navigation and the <head>
// (the <title> repeats the first heading): what a perfect extractor keeps.
void naive_text(const GumboNode* n, bool content_only, std::string& out) {
  if (n->type == GUMBO_NODE_TEXT || n->type == GUMBO_NODE_WHITESPACE ||
      n->type == GUMBO_NODE_CDATA) {
    out += n->v.text.text;
    return;
  }
  const GumboVector* kids = nullptr;
  if (n->type == GUMBO_NODE_DOCUMENT) {
    kids = &n->v.document.children;
  } else if (n->type == GUMBO_NODE_ELEMENT) {
    const GumboElement& e = n->v.element;
    if (e.tag == GUMBO_TAG_SCRIPT || e.tag == GUMBO_TAG_STYLE) return;
    if (content_only && (e.tag == GUMBO_TAG_HEAD || is_docbook_navigation(e))) return;
    kids = &e.children;
  }
  if (!kids) return;
  for (unsigned i = 0; i < kids->length; ++i)
    naive_text(static_cast<const GumboNode*>(kids->data[i]), content_only, out);
  if (n->type == GUMBO_NODE_ELEMENT && !is_inline_tag(n->v.element.tag)) out += ' ';
}

TEST(ExtractDebianReference, RecallWithinTwoPointsOfNaiveTextWithoutNavigation) {
  // A missing reference is a broken set-up: fail, never skip.
  if (!fs::exists(fs::path(kDebianReference) / "ch09.en.html"))
    GTEST_FAIL() << "Debian's debian-reference-en is missing (" << kDebianReference
                 << "): run scripts/setup.sh --test, which installs it";
  std::vector<std::string> pages;
  for (const auto& e : fs::directory_iterator(kDebianReference)) {
    std::string name = e.path().filename().string();
    // index.en.html is the book's table of contents: navigation only.
    if (name.ends_with(".en.html") && name != "index.en.html") pages.push_back(e.path().string());
  }
  std::sort(pages.begin(), pages.end());
  ASSERT_GE(pages.size(), 14u);  // preface, 12 chapters, appendix
  Overlap all_content, all_naive;
  for (const std::string& page : pages) {
    std::string html = test::read_file(page);
    HtmlExtractStats st;
    Bag got = bag_of(html_to_text(html, {}, &st));
    GumboOutput* doc = gumbo_parse_with_options(&kGumboDefaultOptions, html.data(), html.size());
    std::string content, naive;
    naive_text(doc->document, true, content);
    naive_text(doc->document, false, naive);
    gumbo_destroy_output(&kGumboDefaultOptions, doc);
    // Recall of the content's words: the naive extraction has 1 (it keeps
    // everything); ours must be within 2 points of it.
    Overlap c = overlap(got, bag_of(content)), n = overlap(got, bag_of(naive));
    double recall = double(c.common) / double(c.source);
    EXPECT_GE(recall, 0.98) << page;
    // And the navigation stays out: words beyond the content's are at most
    // 0.2% of the text (the previous/next tables and the contents' heading
    // alone are more on the shorter chapters).
    EXPECT_LE(double(c.extracted - c.common), 0.002 * double(c.extracted)) << page;
    std::printf(
        "%s: recall %.4f of the content, %.4f of all text; %ld words beyond the "
        "content; %ld link-dense tables kept\n",
        fs::path(page).filename().c_str(), recall, double(n.common) / double(n.source),
        long(c.extracted - c.common), long(st.link_tables_kept));
    for (auto [sum, o] : {std::pair{&all_content, c}, std::pair{&all_naive, n}}) {
      sum->extracted += o.extracted;
      sum->source += o.source;
      sum->common += o.common;
    }
  }
  std::printf("debian-reference: %zu pages; recall %.4f of the content, %.4f of all text\n",
              pages.size(), double(all_content.common) / double(all_content.source),
              double(all_naive.common) / double(all_naive.source));
}

}  // namespace
}  // namespace nk::curate
