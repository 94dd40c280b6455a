// Hugging Face's normalizers one by one, with expected outputs derived by hand
// from the Rust `tokenizers` crate's rules (and checked against it, through its
// Node binding, when these were written): where JavaScript's
// @huggingface/tokenizers differs (a word-final Σ, Strip's white space,
// Prepend on empty text, BertNormalizer's control characters) these are the
// cases the parity tests cannot cover. Then every refused input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/tokenizer/text_normalizer.h"
#include "test_util.h"

namespace nk {
namespace {

using nlohmann::json;
using test::contains;
using test::error_of;

std::string normalize(const json& j, const std::string& text) {
  auto n = TextNormalizer::from_json(j, "tokenizer.json");
  return n ? n->normalize(text) : text;
}

json seq(const json& list) {
  return {{"type", "Sequence"}, {"normalizers", list}};
}

TEST(TextNormalizer, UnicodeForms) {
  const std::string text = "Cafe\u0301 \u00c5 \ufb01 \uff11\uff12 \u210c \u1100\u1161";
  EXPECT_EQ(normalize({{"type", "NFC"}}, text),
            "Caf\u00e9 \u00c5 \ufb01 \uff11\uff12 \u210c \uac00");
  EXPECT_EQ(normalize({{"type", "NFD"}}, text),
            "Cafe\u0301 A\u030a \ufb01 \uff11\uff12 \u210c \u1100\u1161");
  EXPECT_EQ(normalize({{"type", "NFKC"}}, text), "Caf\u00e9 \u00c5 fi 12 H \uac00");
  EXPECT_EQ(normalize({{"type", "NFKD"}}, text), "Cafe\u0301 A\u030a fi 12 H \u1100\u1161");
  EXPECT_EQ(normalize({{"type", "NFC"}}, ""), "");
}

TEST(TextNormalizer, LowercaseIsPerCodePoint) {
  // İ has a two-character lowercase (i + combining dot); Σ is σ wherever it
  // stands (Rust's char::to_lowercase; JavaScript would end ΟΔΟΣ with ς).
  EXPECT_EQ(normalize({{"type", "Lowercase"}}, "\u0130stanbul \u039f\u0394\u039f\u03a3 \u03a3A"),
            "i\u0307stanbul \u03bf\u03b4\u03bf\u03c3 \u03c3a");
  EXPECT_EQ(normalize({{"type", "Lowercase"}}, "\u00c9COLE \u0416\u0401 \u1e9e ABC xyz \U00010400"),
            "\u00e9cole \u0436\u0451 \u00df abc xyz \U00010428");
}

TEST(TextNormalizer, ReplacePrependStrip) {
  const json llama2 =
      seq({{{"type", "Prepend"}, {"prepend", "\u2581"}},
           {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}});
  EXPECT_EQ(normalize(llama2, "Hello  world "), "\u2581Hello\u2581\u2581world\u2581");
  EXPECT_EQ(normalize(llama2, ""), "");  // Prepend leaves empty text empty
  EXPECT_EQ(normalize({{"type", "Replace"}, {"pattern", {{"String", "ab"}}}, {"content", "x"}},
                      "aabab ba"),
            "axx ba");
  EXPECT_EQ(normalize({{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}},
                      "a \t\u3000b\n\nc"),
            "a b c");
  // The content is literal text, not a substitution template.
  EXPECT_EQ(
      normalize({{"type", "Replace"}, {"pattern", {{"Regex", "(b)"}}}, {"content", "$1"}}, "abc"),
      "a$1c");
  // Strip takes Unicode White_Space: U+0085 and U+3000 go, U+FEFF (not
  // White_Space; JavaScript's trim would take it) stays.
  const std::string padded = " \u0085\u3000\ufeffx y\t\n\u00a0";
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}, padded),
            "\ufeffx y");
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}}, padded),
            " \u0085\u3000\ufeffx y");
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", true}}, padded), "\ufeffx y\t\n\u00a0");
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}, " \t "),
            "");
}

TEST(TextNormalizer, StripAccentsDropsEveryMark) {
  // Mn (U+0301), Mc (U+0903) and Me (U+20DD) alike; precomposed letters stay.
  EXPECT_EQ(normalize({{"type", "StripAccents"}}, "e\u0301 \u0903x\u20dd \u00e9"), "e x \u00e9");
  EXPECT_EQ(normalize(seq({{{"type", "NFD"}}, {{"type", "StripAccents"}}}), "\u00e9t\u00e9 \u00f1"),
            "ete n");
}

TEST(TextNormalizer, BertNormalizer) {
  const json bert = {{"type", "BertNormalizer"},
                     {"clean_text", true},
                     {"handle_chinese_chars", true},
                     {"strip_accents", nullptr},
                     {"lowercase", true}};
  // NUL, U+00AD (Cf), U+E000 (Co), U+0085 (Cc) and U+200B (Cf) go; U+0378
  // (unassigned) stays; U+00A0 and \t become ' '; CJK gets spaces around it;
  // accents go with lowercase.
  EXPECT_EQ(normalize(bert, std::string("A") + '\0' +
                                "b\u00adc\u0378d\ue000e\u0085f\u00a0g\u200bh\tI "
                                "\u4e2d\u6587 \u00c9 \u03a3"),
            "abc\u0378def gh i  \u4e2d  \u6587  e \u03c3");
  const json keep = {{"type", "BertNormalizer"},
                     {"clean_text", true},
                     {"handle_chinese_chars", false},
                     {"strip_accents", true},
                     {"lowercase", false}};
  // Only Mn goes with strip_accents; VT and FF are controls (dropped) before
  // white space becomes ' ' (U+2028).
  EXPECT_EQ(normalize(keep, "E\u0301 \u0903 x\u20dd \ufffd\u001f|\u2028|\u000b|\u000c|"),
            "E \u0903 x\u20dd | |||");
  // CJK blocks as BERT lists them: Ext. B and the compatibility supplement,
  // not the unassigned gap after Ext. D.
  const json cjk = {{"type", "BertNormalizer"}, {"clean_text", false}, {"lowercase", false}};
  EXPECT_EQ(normalize(cjk, "\u3400\U0002A6DF\U0002B820\U0002F800\u4dc0"),
            " \u3400  \U0002A6DF \U0002B820 \U0002F800 \u4dc0");
}

TEST(TextNormalizer, InvalidUtf8IsRepairedFirst) {
  const json all = seq({{{"type", "NFKC"}},
                        {{"type", "Lowercase"}},
                        {{"type", "StripAccents"}},
                        {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                        {{"type", "Replace"}, {"pattern", {{"Regex", "\\s"}}}, {"content", "_"}},
                        {{"type", "BertNormalizer"}, {"clean_text", false}}});
  EXPECT_EQ(normalize(all,
                      " A\xff\xe2\x82"
                      "B e\xcc\x81 \xed\xa0\x80"),
            "a\ufffd\ufffdb_e_\ufffd\ufffd\ufffd");
}

TEST(TextNormalizer, NullAndEmptySequenceAreNone) {
  EXPECT_EQ(TextNormalizer::from_json(nullptr, "f"), nullptr);
  EXPECT_EQ(TextNormalizer::from_json(seq(json::array()), "f"), nullptr);
  EXPECT_NE(TextNormalizer::from_json(seq({{{"type", "NFC"}}}), "f"), nullptr);
}

TEST(TextNormalizer, RefusedInputsNameTheFileAndPath) {
  struct Case {
    json normalizer;
    std::string message;
  };
  const std::vector<Case> cases = {
      {seq({{{"type", "NFC"}}, {{"type", "Lowercase"}}, {{"type", "Precompiled"}}}),
       "tokenizer.json: normalizer.normalizers[2].type 'Precompiled' is not supported"},
      {seq(json::array({seq({{{"type", "Nope"}}})})),
       "tokenizer.json: normalizer.normalizers[0].normalizers[0].type 'Nope' is not supported"},
      {{{"type", 3}}, "tokenizer.json: normalizer.type must be a string"},
      {"NFC", "tokenizer.json: normalizer must be an object"},
      {{{"type", "Sequence"}}, "tokenizer.json: normalizer.normalizers must be an array"},
      {{{"type", "Replace"}, {"pattern", {{"Regex", "(a"}}}, {"content", "x"}},
       "tokenizer.json: normalizer.pattern.Regex: pre-tokenizer pattern '(a': missing closing "
       "parenthesis"},
      {{{"type", "Replace"}, {"pattern", {{"Regex", "a*"}}}, {"content", "x"}},
       "tokenizer.json: normalizer.pattern.Regex 'a*' can match the empty string"},
      {{{"type", "Replace"}, {"pattern", {{"String", ""}}}, {"content", "x"}},
       "tokenizer.json: normalizer.pattern must be {\"String\": non-empty text}"},
      {{{"type", "Replace"}, {"pattern", {{"String", " "}}}},
       "tokenizer.json: normalizer.content must be a string, got null"},
      {{{"type", "Prepend"}, {"prepend", 1}},
       "tokenizer.json: normalizer.prepend must be a string"},
      {{{"type", "Strip"}, {"strip_left", "yes"}},
       "tokenizer.json: normalizer.strip_left must be true or false"},
      {{{"type", "BertNormalizer"}, {"lowercase", 1}},
       "tokenizer.json: normalizer.lowercase must be true or false"},
  };
  for (const Case& c : cases) {
    const std::string e =
        error_of([&] { TextNormalizer::from_json(c.normalizer, "tokenizer.json"); });
    EXPECT_TRUE(contains(e, c.message)) << c.normalizer.dump() << ": " << e;
  }
}

}  // namespace
}  // namespace nk
