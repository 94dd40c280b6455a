#include "data/tokenizer/byte_tokenizer.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace nk {

TEST(ByteTokenizer, RoundTripsAsciiAndMultiByteUtf8) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 257);
  std::string text = "héllo, 世界 🐟\n\t";
  std::vector<int32_t> ids = tok.encode(text);
  EXPECT_EQ(ids.size(), text.size());  // one token per byte
  EXPECT_EQ(ids[0], 'h');
  EXPECT_EQ(ids[1], 0xC3);  // é = C3 A9
  EXPECT_EQ(ids[2], 0xA9);
  for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < 256);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(ByteTokenizer, AllBytesAndEot) {
  ByteTokenizer tok;
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(char(b));
  std::vector<int32_t> ids = tok.encode(all);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  ids.insert(ids.begin() + 10, ByteTokenizer::kEot);
  ids.push_back(ByteTokenizer::kEot);
  EXPECT_EQ(tok.decode(ids), all);  // EOT decodes to nothing
}

TEST(ByteTokenizer, OutOfRangeIdIsAnError) {
  ByteTokenizer tok;
  EXPECT_THROW(tok.decode(std::vector<int32_t>{65, 257}), Error);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{-1}), Error);
  try {
    tok.decode(std::vector<int32_t>{65, 66, 1000});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1000"), std::string::npos);
  }
}

}  // namespace nk
