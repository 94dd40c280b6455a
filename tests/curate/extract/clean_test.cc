#include "curate/extract/clean.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <memory>
#include <string>

#include "curate/stages.h"
#include "test_util.h"

#include "curate/stage_util.h"

namespace nk::curate {
namespace {

using test::contains;

std::string mojibake(std::string s, size_t* fixed = nullptr) {
  size_t n = fix_mojibake(s);
  if (fixed) *fixed = n;
  return s;
}

TEST(CleanMojibake, RepairsUtf8ReadAsWindows1252) {
  size_t n = 0;
  EXPECT_EQ(mojibake("CafÃ© crÃ¨me", &n), "Café crème");
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(mojibake("It\xC3\xA2\xE2\x82\xAC\xE2\x84\xA2s"), "It’s");  // "Itâ€™s"
  EXPECT_EQ(mojibake("â€œquotedâ€\x9D and â€” dash"), "“quoted” and — dash");
  EXPECT_EQ(mojibake("GrÃ¶ÃŸe Ãœbung"), "Größe Übung");
  EXPECT_EQ(mojibake("ZaÅ¼Ã³Å‚Ä‡"), "Zażółć");
  EXPECT_EQ(mojibake("ÐŸÑ€Ð¸Ð²ÐµÑ‚ Ð¼Ð¸Ñ€"), "Привет мир");
  EXPECT_EQ(mojibake("æ—¥æœ¬èªž"), "日本語");
  EXPECT_EQ(mojibake("price: 10Â\xC2\xA0€"), "price: 10\xC2\xA0€");  // "Â" + NBSP
  // Latin-1 decoding leaves C1 controls instead of cp1252 punctuation.
  EXPECT_EQ(mojibake("it\xC3\xA2\xC2\x80\xC2\x99s"), "it’s");
  // Twice mis-decoded: repaired twice.
  EXPECT_EQ(mojibake("CafÃƒÂ©"), "Café");
  // A 4-byte character (emoji).
  EXPECT_EQ(mojibake("smile ðŸ˜€"), "smile 😀");
}

TEST(CleanMojibake, LeavesCorrectTextAlone) {
  const char* good[] = {
      "SÃO PAULO, NÃO, IRMÃ",         // Portuguese capitals
      "Ärger über Öl, „groß“",        // German, with German quotes after ß
      "CAFÉ” and ÉTÉ…",               // capitals before punctuation
      "Señor «Ñu» — naïve façade",    // ordinary Latin-1 letters and symbols
      "Ã alone, Â then text",         // the lead letters without a follow-up
      "日本語のテキスト and Привет",  // correct non-Latin text
      "plain ascii",
  };
  for (const char* g : good) {
    size_t n = 7;
    EXPECT_EQ(mojibake(g, &n), g);
    EXPECT_EQ(n, 0u) << g;
  }
}

TEST(CleanControlChars, RemovesControlsAndInvisibleJunk) {
  std::string s =
      "a\x01"
      "b\x7F"
      "c\tkeep\nline\r\n\xC2\x85"
      "d\xC2\x9F"
      "e\xE2\x80\x8B"
      "f\xEF\xBB\xBF"
      "g\xC2\xAD"
      "h";
  EXPECT_EQ(remove_control_chars(s), 7u);
  EXPECT_EQ(s, "abc\tkeep\nline\r\ndefgh");
  // ZWJ in an emoji sequence and ZWNJ in Persian stay; so does U+00A0..
  std::string keep =
      "👩\xE2\x80\x8D💻 \xD9\x85\xDB\x8C\xE2\x80\x8C\xD8\xAE\xD9\x88\xD8\xA7\xD9\x87\xD9\x85 "
      "a\xC2\xA0"
      "b é";
  std::string before = keep;
  EXPECT_EQ(remove_control_chars(keep), 0u);
  EXPECT_EQ(keep, before);
}

std::string ws(std::string s) {
  normalize_whitespace(s);
  return s;
}

TEST(CleanWhitespace, CollapsesTrimsAndLimitsBlankLines) {
  EXPECT_EQ(ws("  a   b \t\nc  \r\nd\re"), "a b\nc\nd\ne");
  EXPECT_EQ(ws("p1\n\n\n\n\np2\n \n\t\np3\n\n"), "p1\n\np2\n\np3");
  EXPECT_EQ(ws("x\xC2\xA0\xC2\xA0y\xE2\x80\x83z\xE2\x80\xAFw\fv"), "x y z w v");
  EXPECT_EQ(ws("code:\n    indented   line\n\tx"), "code:\n    indented line\n\tx");
  EXPECT_EQ(ws("\n\n   lead"), "lead");
  EXPECT_EQ(ws("cell\tcell  \t next"), "cell\tcell\tnext");
  EXPECT_EQ(ws(" \n\t\n "), "");
  // CJK text (and its ideographic space) is untouched.
  std::string cjk = "我们今天去北京大学看书。\n日本語のテキスト\xE3\x80\x80全角空白";
  EXPECT_EQ(ws(cjk), cjk);
  std::string already = "already\n\nclean text";
  EXPECT_FALSE(normalize_whitespace(already));
}

TEST(CleanNfc, ComposesAndKeepsNormalizedText) {
  EXPECT_EQ(nfc("e\xCC\x81t\xC3\xA9"), "\xC3\xA9t\xC3\xA9");  // e + U+0301 → é
  EXPECT_EQ(nfc("A\xCC\x8A"), "\xC3\x85");                    // Å
  EXPECT_EQ(nfc("한국어"), "한국어");
  EXPECT_EQ(nfc("\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB"), "한");  // conjoining jamo
  EXPECT_EQ(nfc("ascii"), "ascii");
  EXPECT_EQ(nfc(""), "");
}

std::string repeated(std::string s, size_t min = 1, size_t* n = nullptr) {
  size_t k = remove_repeated_lines(s, min);
  if (n) *n = k;
  return s;
}

TEST(CleanRepeatedLines, DropsLaterCopiesOnly) {
  size_t n = 0;
  EXPECT_EQ(repeated("Menu\nText one\n\nMenu\nText two\nMenu", 1, &n),
            "Menu\nText one\n\nText two");
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(repeated("a\n\nb\n\na\n\nc"), "a\n\nb\n\nc");         // no blank-line pile-up
  EXPECT_EQ(repeated("x\n\n\ny"), "x\n\n\ny");                    // blank lines are not "repeats"
  EXPECT_EQ(repeated("Same\nsame\nSame "), "Same\nsame\nSame ");  // exact comparison
  // Below the length threshold lines are kept even when repeated.
  EXPECT_EQ(repeated("}\nlong line\n}\nlong line", 2), "}\nlong line\n}");
  EXPECT_EQ(repeated("}\nlong line\n}\nlong line", 1), "}\nlong line");
}

std::string boiler(std::string s, int max_words = 10, size_t* n = nullptr) {
  size_t k = remove_boilerplate_lines(s, default_boilerplate_phrases(), max_words);
  if (n) *n = k;
  return s;
}

TEST(CleanBoilerplateLines, DropsShortLinesWithPhrases) {
  size_t n = 0;
  EXPECT_EQ(boiler("Real content here.\n© 2024 ACME. All Rights Reserved.\nWe use cookies.\n"
                   "Sign in | Register\nMore content.",
                   10, &n),
            "Real content here.\nMore content.");
  EXPECT_EQ(n, 3u);
  // Long lines are content even when they mention a phrase.
  std::string long_line =
      "In this essay we explain how a browser stores a cookie and why it matters for users.";
  EXPECT_EQ(boiler(long_line), long_line);
  // At the word limit: 10 words drop, 11 stay.
  EXPECT_EQ(boiler("one two three four five six seven eight privacy policy"), "");
  EXPECT_EQ(boiler("one two three four five six seven eight nine privacy policy"),
            "one two three four five six seven eight nine privacy policy");
  // Word boundaries: "design in" is not "sign in", "blogin" not "log in".
  EXPECT_EQ(boiler("A design in blue\nblogin"), "A design in blue\nblogin");
  EXPECT_EQ(boiler("Header\n\nLog In\n\nBody"), "Header\n\nBody");
}

TEST(CleanStage, AppliesEveryRuleAndCounts) {
  auto s = test_stage::make_stage("type: clean");
  Counters counts;
  Document d{"a",
             "  CafÃ©\x01 menu\r\n\r\n\r\n\r\nNa\xC3\xAF"
             "ve e\xCC\x81t\xC3\xA9  text\n"
             "All rights reserved.\nCaf\xC3\xA9 menu\nend  "};
  EXPECT_TRUE(s->apply(d, counts).keep);
  EXPECT_EQ(d.text, "Café menu\n\nNaïve été text\nend");
  EXPECT_EQ(counts["mojibake_fixed"], 1);
  EXPECT_EQ(counts["control_chars_removed"], 1);
  EXPECT_EQ(counts["nfc_changed"], 1);
  EXPECT_EQ(counts["lines_removed_repeated"], 1);
  EXPECT_EQ(counts["lines_removed_boilerplate"], 1);

  Document empty{"b", " \xE2\x80\x8B\n\t\x02 "};
  Verdict v = s->apply(empty, counts);
  EXPECT_FALSE(v.keep);
  EXPECT_EQ(v.reason, "empty after cleaning");
}

TEST(CleanStage, RulesCanBeSwitchedOffAndPhrasesReplaced) {
  auto s = test_stage::make_stage(
      "type: clean\nnfc: false\nfix_mojibake: no\ncontrol_chars: false\nwhitespace: false\n"
      "repeated_lines: false\nboilerplate_phrases: [Buy Now]\nboilerplate_max_words: 3");
  Counters counts;
  std::string text = "CafÃ©  e\xCC\x81\x01\nx\nx\nCookies here\nbuy now!\nplease buy now today";
  Document d{"a", text};
  EXPECT_TRUE(s->apply(d, counts).keep);
  EXPECT_EQ(d.text, "CafÃ©  e\xCC\x81\x01\nx\nx\nCookies here\nplease buy now today");
  EXPECT_EQ(counts["lines_removed_boilerplate"], 1);
  EXPECT_EQ(counts.count("mojibake_fixed"), 0u);
}

TEST(CleanStage, BadSettingsNameTheKey) {
  std::string e = test::error_of([] { test_stage::make_stage("type: clean\nnfc: maybe"); });
  EXPECT_TRUE(contains(e, "pipeline.yaml:2: stage 1 (clean): key 'nfc'")) << e;
  e = test::error_of([] { test_stage::make_stage("type: clean\nboilerplate_max_words: 0"); });
  EXPECT_TRUE(contains(e, "key 'boilerplate_max_words'")) << e;
  e = test::error_of([] { test_stage::make_stage("type: clean\nboilerplate_phrases: {a: 1}"); });
  EXPECT_TRUE(contains(e, "key 'boilerplate_phrases'")) << e;
  e = test::error_of([] { test_stage::make_stage("type: clean\nwhitespaces: true"); });
  EXPECT_TRUE(contains(e, "unknown key 'whitespaces'")) << e;
}

TEST(CleanStage, IsFastOnBigDocuments) {
  std::string big;
  while (big.size() < 8000000)
    big += "A line of ordinary  text, with   some spaces and caf\xC3\xA9 words " +
           std::to_string(big.size()) + ".\n\n";
  auto s = test_stage::make_stage("type: clean");
  Counters counts;
  Document d{"big", big};
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(s->apply(d, counts).keep);
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double mbps = double(big.size()) / 1e6 / sec;
  std::printf("clean: %.1f MB in %.3f s (%.1f MB/s)\n", double(big.size()) / 1e6, sec, mbps);
  EXPECT_TRUE(contains(d.text, "A line of ordinary text, with some spaces"));
}

}  // namespace
}  // namespace nk::curate
