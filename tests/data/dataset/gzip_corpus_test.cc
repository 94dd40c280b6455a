#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "data/dataset/text_dataset.h"
#include "test_paths.h"

namespace nk {
namespace {

namespace fs = std::filesystem;

fs::path dir() {
  fs::path d = fs::path(NK_BINARY_DIR) / "gzip_corpus_test";
  fs::create_directories(d);
  return d;
}

TEST(GzipCorpus, ReadsGzAndDzLikePlainText) {
  std::string text;
  for (int i = 0; i < 2000; ++i)
    text += "Gr\xc3\xbc\xc3\x9f Gott, line " + std::to_string(i) + "\n";
  for (const char* name : {"c.txt.gz", "c.dict.dz"}) {
    fs::path p = dir() / name;
    gzFile f = gzopen(p.c_str(), "wb");
    ASSERT_TRUE(f);
    gzwrite(f, text.data(), unsigned(text.size()));
    gzclose(f);
    TextCorpus c = TextCorpus::load(p.string(), 0.0, 0);
    ASSERT_EQ(c.train.size(), text.size());
    for (size_t i = 0; i < text.size(); ++i)
      ASSERT_EQ(c.train[i], int32_t(static_cast<unsigned char>(text[i])));
    // max_bytes cuts at a character boundary: byte 3 is inside "\xc3\xbc".
    TextCorpus cut = TextCorpus::load(p.string(), 0.0, 3);
    EXPECT_EQ(cut.train.size(), 2u);
  }
}

TEST(GzipCorpus, CorruptGzipNamesTheFile) {
  fs::path p = dir() / "bad.gz";
  std::ofstream(p, std::ios::binary) << std::string("\x1f\x8b\x08\x00garbage-not-deflate", 23);
  try {
    TextCorpus::load(p.string(), 0.0, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.gz"), std::string::npos) << e.what();
  }
  EXPECT_THROW(TextCorpus::load((dir() / "missing.gz").string(), 0.0, 0), Error);
}

TEST(TextCorpusReplace, InvalidBytesBecomeReplacementCharacter) {
  fs::path p = dir() / "cp1252.txt";
  std::ofstream(p, std::ios::binary) << "it\x92s ok \xff";
  EXPECT_THROW(TextCorpus::load(p.string(), 0.0, 0), Error);
  TextCorpus c = TextCorpus::load(p.string(), 0.0, 0, /*replace_invalid=*/true);
  EXPECT_EQ(c.replaced, 2);
  std::string want = "it\xEF\xBF\xBDs ok \xEF\xBF\xBD";
  ASSERT_EQ(c.train.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(c.train[i], int32_t(static_cast<unsigned char>(want[i])));
}

}  // namespace
}  // namespace nk
