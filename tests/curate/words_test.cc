#include "curate/words.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace nk::curate {
namespace {

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  for (std::string_view w : words_of(s)) out.emplace_back(w);
  return out;
}

TEST(Words, SpaceSeparatedScriptsSplitAtPunctuation) {
  using V = std::vector<std::string>;
  EXPECT_EQ(words("Hello, world! It's 2024..."), (V{"Hello", "world", "It's", "2024"}));
  EXPECT_EQ(words("Größe über-alles; l’homme"), (V{"Größe", "über", "alles", "l’homme"}));
  EXPECT_EQ(words("Привет,  мир —  тест"), (V{"Привет", "мир", "тест"}));
  EXPECT_EQ(words("  \t\n ... !!! "), V{});
  EXPECT_EQ(words("e\xcc\x81t\xc3\xa9"),
            V{"e\xcc\x81t\xc3\xa9"});  // a combining accent stays inside
}

TEST(Words, ChineseJapaneseAndThaiUseTheDictionary) {
  // ICU's dictionary break: several words, never one per sentence, never one
  // per character for the whole run.
  auto zh = words("我们今天去北京大学看书。");
  EXPECT_GE(zh.size(), 4u);
  EXPECT_LT(zh.size(), 11u);
  EXPECT_EQ(zh.front(), "我们");
  auto ja = words("私は東京に住んでいます。");
  EXPECT_GE(ja.size(), 4u);
  EXPECT_EQ(ja.front(), "私");
  auto th = words("ภาษาไทยเขียนติดกันโดยไม่เว้นวรรค");
  EXPECT_GE(th.size(), 4u);
  EXPECT_EQ(th.front(), "ภาษา");
  std::string joined;
  for (const auto& w : th) joined += w;
  EXPECT_EQ(joined, "ภาษาไทยเขียนติดกันโดยไม่เว้นวรรค");
  EXPECT_EQ(words("2024年に"), (std::vector<std::string>{"2024", "年", "に"}));
}

TEST(Words, Utf8Length) {
  EXPECT_EQ(utf8_length("aé中😀"), 4u);
}

}  // namespace
}  // namespace nk::curate
