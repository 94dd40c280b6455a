#include "curate/pipeline/record.h"

#include <gtest/gtest.h>

#include <string>

#include "data/jsonl_reader.h"

namespace nk::curate {
namespace {

bool parse(RecordParser& p, const std::string& line, Document& d, std::string& why) {
  std::string padded = line + std::string(kJsonPadding, ' ');
  return p.parse(std::string_view(padded.data(), line.size()), d, why);
}

TEST(Record, RoundTripKeepsFieldsAndEscapes) {
  RecordParser p("content", "doc_id");
  Document d;
  std::string why;
  std::string text = "quote \" backslash \\ tab \t nl \n ctrl \x01 uni \xc3\xa9 \xf0\x9f\x98\x80";
  nlohmann::json in = {{"doc_id", "x1"}, {"content", text}, {"n", 3}, {"tags", {"a", "b"}}};
  ASSERT_TRUE(parse(p, in.dump(), d, why)) << why;
  EXPECT_EQ(d.id, "x1");
  EXPECT_EQ(d.text, text);
  EXPECT_EQ(d.meta["n"], 3);
  d.meta["language"] = "en";
  std::string out;
  append_record(out, d, "word_count", "word_count 3 < 50");
  ASSERT_EQ(out.back(), '\n');
  nlohmann::json back = nlohmann::json::parse(out);
  EXPECT_EQ(back["id"], "x1");
  EXPECT_EQ(back["text"], text);
  EXPECT_EQ(back["tags"], nlohmann::json({"a", "b"}));
  EXPECT_EQ(back["language"], "en");
  EXPECT_EQ(back["removed_by"], "word_count");
  EXPECT_EQ(back["reason"], "word_count 3 < 50");
  // Field order: id, text, then the input's other fields, then labels.
  EXPECT_LT(out.find("\"n\""), out.find("\"tags\""));
  EXPECT_LT(out.find("\"tags\""), out.find("\"language\""));
}

TEST(Record, NumericIdsAndBadLines) {
  RecordParser p("text", "id");
  Document d;
  std::string why;
  ASSERT_TRUE(parse(p, R"({"id": 17, "text": "x"})", d, why)) << why;
  EXPECT_EQ(d.id, "17");
  ASSERT_TRUE(parse(p, R"({"text": "no id"})", d, why));
  EXPECT_EQ(d.id, "");
  EXPECT_FALSE(parse(p, R"({"text": 5})", d, why));
  EXPECT_EQ(why, "\"text\" is not a string");
  EXPECT_FALSE(parse(p, R"({"id": 1})", d, why));
  EXPECT_EQ(why, "no key \"text\"");
  EXPECT_FALSE(parse(p, R"([1,2])", d, why));
  EXPECT_EQ(why, "the line is not a JSON object");
  EXPECT_FALSE(parse(p, "{\"text\": \"a\xff\"}", d, why));
  EXPECT_EQ(why, "invalid UTF-8 at byte 11 of the line");
  EXPECT_FALSE(parse(p, R"({"text": "a")", d, why));
  EXPECT_NE(why.find("invalid JSON"), std::string::npos) << why;
}

}  // namespace
}  // namespace nk::curate
