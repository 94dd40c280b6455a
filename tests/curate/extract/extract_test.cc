#include <gtest/gtest.h>
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
      "<div class='navigator-guide'>x</div>", "<div class='download'>x</div>",
      "<div class='loaded'>x</div>",          "<div id='edit-menu-shell-and-editor'>x</div>",
      "<section id='menu'>x</section>",       "<div class='headerlink-free'>x</div>",
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

}  // namespace
}  // namespace nk::curate
