#include "data/dataset/text_dataset.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "core/error.h"
#include "data/tokenizer/byte_tokenizer.h"
#include "test_util.h"

namespace nk {
namespace fs = std::filesystem;

namespace {

class TextDatasetTest : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    std::string p = dir_ / name;
    test::write_file(p, bytes);
    return p;
  }
  static std::string load_error(const std::string& p, int64_t max_bytes = 0) {
    return test::error_of([&] { TextCorpus::load(p, 0.1, max_bytes); });
  }
  test::TempDir dir_{"nk_text_test"};
};

std::vector<int32_t> iota_tokens(int n) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

// Batches [count] from a loader, flattened: inputs then targets for each.
std::vector<int32_t> draw(TokenLoader& l, int64_t B, int64_t T, int count) {
  std::vector<int32_t> out;
  Tensor x = Tensor::empty({B, T}, DType::I32), y = Tensor::empty({B, T}, DType::I32);
  for (int i = 0; i < count; ++i) {
    l.next(x, y);
    out.insert(out.end(), x.data<int32_t>(), x.data<int32_t>() + B * T);
    out.insert(out.end(), y.data<int32_t>(), y.data<int32_t>() + B * T);
  }
  return out;
}

}  // namespace

TEST(Utf8, FindsFirstInvalidSequence) {
  EXPECT_EQ(find_invalid_utf8("plain ascii"), -1);
  EXPECT_EQ(find_invalid_utf8("h\xC3\xA9 \xE4\xB8\x96 \xF0\x9F\x90\x9F"), -1);
  EXPECT_EQ(find_invalid_utf8("ab\x80"), 2);            // stray continuation
  EXPECT_EQ(find_invalid_utf8("ab\xC3"), 2);            // truncated at the end
  EXPECT_EQ(find_invalid_utf8("a\xC3(b"), 1);           // bad continuation
  EXPECT_EQ(find_invalid_utf8("a\xC0\xAF"), 1);         // overlong '/'
  EXPECT_EQ(find_invalid_utf8("a\xE0\x80\xAF"), 1);     // overlong, 3 bytes
  EXPECT_EQ(find_invalid_utf8("ok\xED\xA0\x80"), 2);    // UTF-16 surrogate
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0);  // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("\xFF"), 0);
  EXPECT_EQ(find_invalid_utf8("\xF4\x8F\xBF\xBF"), -1);  // U+10FFFF itself
}

TEST_F(TextDatasetTest, InvalidUtf8ReportsFileAndOffset) {
  std::string p = write("bad.txt", "hello w\xC3\xB6rld\n\xFFtail");
  EXPECT_EQ(load_error(p), p + ": invalid UTF-8 at byte offset 13");
}

TEST_F(TextDatasetTest, EmptyAndMissingFiles) {
  std::string e = write("empty.txt", "");
  EXPECT_EQ(load_error(e), "corpus '" + e + "' is empty");
  std::string m = dir_ / "missing.txt";
  EXPECT_EQ(load_error(m), "corpus file '" + m + "' not found");
  std::string d = dir_ / "adir";
  fs::create_directories(d);
  EXPECT_NE(load_error(d).find(d), std::string::npos);
}

TEST_F(TextDatasetTest, ValSplitSizes) {
  std::string text(1000, 'a');
  text[999] = 'z';
  std::string p = write("c.txt", text);
  TextCorpus c = TextCorpus::load(p, 0.1, 0);
  EXPECT_EQ(c.train.size(), 900u);
  EXPECT_EQ(c.val.size(), 100u);
  EXPECT_EQ(c.val.back(), 'z');  // the validation split is the tail
  TextCorpus none = TextCorpus::load(p, 0.0, 0);
  EXPECT_EQ(none.train.size(), 1000u);
  EXPECT_TRUE(none.val.empty());
  TextCorpus odd = TextCorpus::load(p, 0.0015, 0);
  EXPECT_EQ(odd.val.size(), 1u);  // floor(1.5)
  EXPECT_EQ(odd.train.size(), 999u);
  EXPECT_THROW(TextCorpus::load(p, 1.0, 0), Error);
  EXPECT_THROW(TextCorpus::load(p, -0.1, 0), Error);
}

TEST_F(TextDatasetTest, MaxBytesCutsAtCharacterBoundary) {
  // "aé世🐟" = 1 + 2 + 3 + 4 bytes.
  std::string text = "a\xC3\xA9\xE4\xB8\x96\xF0\x9F\x90\x9F";
  std::string p = write("u.txt", text);
  ByteTokenizer tok;
  auto loaded = [&](int64_t max_bytes) {
    TextCorpus c = TextCorpus::load(p, 0.0, max_bytes);
    return tok.decode(c.train);
  };
  EXPECT_EQ(loaded(0), text);
  EXPECT_EQ(loaded(100), text);
  EXPECT_EQ(loaded(10), text);
  EXPECT_EQ(loaded(9), text.substr(0, 6));
  EXPECT_EQ(loaded(7), text.substr(0, 6));
  EXPECT_EQ(loaded(6), text.substr(0, 6));
  EXPECT_EQ(loaded(5), text.substr(0, 3));
  EXPECT_EQ(loaded(2), "a");
  EXPECT_EQ(loaded(1), "a");
  // Cutting through the only character leaves nothing.
  std::string fish = write("f.txt", "\xF0\x9F\x90\x9F");
  EXPECT_NE(load_error(fish, 3).find("is empty"), std::string::npos);
  // Invalid bytes inside the prefix are still reported.
  std::string bad = write("b.txt", "ab\xFFmore text");
  EXPECT_NE(load_error(bad, 5).find("byte offset 2"), std::string::npos);
}

TEST(TokenLoader, TargetsAreInputsShiftedByOne) {
  std::vector<int32_t> toks = iota_tokens(100);  // token value = position
  TokenLoader l(&toks, 4, 8, 1);
  Tensor x = Tensor::empty({4, 8}, DType::I32), y = Tensor::empty({4, 8}, DType::I32);
  l.next(x, y);
  EXPECT_EQ(l.consumed(), 4u);
  for (int b = 0; b < 4; ++b) {
    int32_t start = x.data<int32_t>()[b * 8];
    EXPECT_EQ(start, l.window_start(uint64_t(b)));
    EXPECT_LE(start + 8, 99);
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(x.data<int32_t>()[b * 8 + t], start + t);
      EXPECT_EQ(y.data<int32_t>()[b * 8 + t], start + t + 1);
    }
  }
}

TEST(TokenLoader, DeterministicPerSeed) {
  std::vector<int32_t> toks = iota_tokens(5000);
  TokenLoader a(&toks, 3, 16, 42), b(&toks, 3, 16, 42), c(&toks, 3, 16, 43);
  std::vector<int32_t> da = draw(a, 3, 16, 5), db = draw(b, 3, 16, 5), dc = draw(c, 3, 16, 5);
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
}

TEST(TokenLoader, WindowsCoverTheCorpus) {
  std::vector<int32_t> toks = iota_tokens(20);
  TokenLoader l(&toks, 1, 4, 7);
  std::set<int64_t> starts;
  for (uint64_t i = 0; i < 2000; ++i) {
    int64_t s = l.window_start(i);
    ASSERT_GE(s, 0);
    ASSERT_LE(s, 20 - 4 - 1);  // the window and its last target fit
    starts.insert(s);
  }
  EXPECT_EQ(starts.size(), 16u);  // every legal start is reachable
  // The smallest legal corpus has exactly one window.
  std::vector<int32_t> five = iota_tokens(5);
  TokenLoader one(&five, 2, 4, 3);
  EXPECT_EQ(one.window_start(0), 0);
  EXPECT_EQ(one.window_start(12345), 0);
}

TEST(TokenLoader, SetConsumedResumesExactly) {
  std::vector<int32_t> toks = iota_tokens(3000);
  TokenLoader full(&toks, 2, 10, 9);
  std::vector<int32_t> all = draw(full, 2, 10, 6);
  TokenLoader first(&toks, 2, 10, 9);
  draw(first, 2, 10, 3);
  TokenLoader resumed(&toks, 2, 10, 9);
  resumed.set_consumed(first.consumed());
  std::vector<int32_t> tail = draw(resumed, 2, 10, 3);
  EXPECT_EQ(tail, std::vector<int32_t>(all.begin() + all.size() / 2, all.end()));
  EXPECT_EQ(resumed.consumed(), full.consumed());
}

TEST(TokenLoader, TooSmallCorpus) {
  std::vector<int32_t> toks = iota_tokens(8);
  EXPECT_EQ(test::error_of([&] { TokenLoader l(&toks, 1, 8, 0); }),
            "corpus too small: 8 tokens, need at least 9 for seq_len 8");
  EXPECT_NO_THROW(TokenLoader(&toks, 1, 7, 0));
  EXPECT_THROW(TokenLoader(&toks, 0, 4, 0), Error);
  EXPECT_THROW(TokenLoader(&toks, 1, 0, 0), Error);
}

TEST(TokenLoader, WrongOutputShapeIsABug) {
  std::vector<int32_t> toks = iota_tokens(100);
  TokenLoader l(&toks, 2, 4, 0);
  Tensor x = Tensor::empty({2, 5}, DType::I32), y = Tensor::empty({2, 4}, DType::I32);
  EXPECT_THROW(l.next(x, y), InternalError);
}

}  // namespace nk
