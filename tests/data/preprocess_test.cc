// JSONL -> indexed dataset: the output, read back by the independent numpy
// reader, equals tokenizing each document directly (+eod) in input order, for
// plain and zstd input and several workers with tiny blocks; JSON unescaping;
// every bad input named by file and line with no output left behind; memory
// bounded on a large input.
#include "data/preprocess.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <zstd.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "data/dataset/megatron_index.h"
#include "data/jsonl_reader.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/tokenizer.h"
#include "data/utf8.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::error_of;
using test::read_with_numpy;
using test::TempDir;
namespace fs = std::filesystem;

std::string zstd_compress(const std::string& s, int level = 3) {
  std::string out(ZSTD_compressBound(s.size()), '\0');
  size_t n = ZSTD_compress(out.data(), out.size(), s.data(), s.size(), level);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

// Two frames back to back, as `cat a.zst b.zst` gives.
std::string zstd_two_frames(const std::string& s) {
  size_t half = s.size() / 2;
  return zstd_compress(s.substr(0, half)) + zstd_compress(s.substr(half), 9);
}

// Documents with varied lengths, ASCII and multi-byte text, quotes,
// backslashes, newlines and control characters that JSON must escape.
std::vector<std::string> random_texts(uint64_t seed, int n) {
  static const char* pieces[] = {
      "the ",   "water ",       "\xC3\xA9t\xC3\xA9 ", "\xE4\xB8\xAD ", "\xF0\x9F\x98\x80",
      "\"q\" ", "back\\slash ", "line\nbreak ",       "tab\t",         "\x01",
      "  ",     "word. "};
  Rng rng(seed);
  std::vector<std::string> docs(static_cast<size_t>(n));
  for (auto& d : docs) {
    int len = int(rng.next_u64() % 60);
    if (rng.next_u64() % 10 == 0) len = 300 + int(rng.next_u64() % 500);  // some long ones
    for (int i = 0; i < len; ++i) d += pieces[rng.next_u64() % std::size(pieces)];
    if (d.empty()) d.push_back('x');
  }
  return docs;
}

// One JSON object per line; every third line escapes all non-ASCII as \uXXXX
// (surrogate pairs for emoji) and carries extra fields around the text.
std::string to_jsonl(const std::vector<std::string>& docs) {
  std::string s;
  for (size_t i = 0; i < docs.size(); ++i) {
    nlohmann::json j;
    if (i % 3 == 0) j["id"] = i;
    j["text"] = docs[i];
    if (i % 3 == 1) j["meta"] = {{"text", 5}, {"x", {1, 2}}};
    s += j.dump(-1, ' ', i % 3 == 0) + (i % 5 == 0 ? "\r\n" : "\n");
  }
  return s;
}

// What the output must hold: each non-empty document tokenized, plus eod.
std::vector<std::vector<int32_t>> expected(const std::vector<std::string>& docs,
                                           const std::string& spec = "bytes", bool eod = true) {
  auto tok = load_tokenizer(spec);
  std::vector<std::vector<int32_t>> out;
  for (auto& d : docs) {
    auto ids = tok->encode(d);
    if (ids.empty()) continue;
    if (eod) ids.push_back(tok->eod_id());
    out.push_back(ids);
  }
  return out;
}

PreprocessOptions options(const std::vector<std::string>& inputs, const std::string& prefix) {
  PreprocessOptions o;
  o.inputs = inputs;
  o.output_prefix = prefix;
  o.workers = 3;
  o.block_bytes = 300;  // many small blocks, so workers finish out of order
  return o;
}

// ---------------------------------------------------------------------------
// JsonlReader

TEST(JsonlReader, LinesAndNumbersPlainAndZstd) {
  TempDir dir("nk_jsonl");
  std::string text = "a\nbb\r\n\nccc";  // no final newline
  test::write_file(dir / "p.jsonl", text);
  test::write_file(dir / "z.jsonl", zstd_two_frames(text));  // zstd found by magic, not name
  test::write_file(dir / "plain.zst", text);                 // and a plain file named .zst
  for (auto name : {"p.jsonl", "z.jsonl", "plain.zst"}) {
    JsonlReader r(dir / name);
    EXPECT_EQ(r.zstd(), std::string(name) == "z.jsonl") << name;
    std::vector<std::pair<int64_t, std::string>> got;
    std::string_view line;
    int64_t no;
    while (r.read_line(line, no)) got.emplace_back(no, std::string(line));
    std::vector<std::pair<int64_t, std::string>> want = {
        {1, "a"}, {2, "bb\r"}, {3, ""}, {4, "ccc"}};
    EXPECT_EQ(got, want) << name;
    EXPECT_EQ(r.bytes_decoded(), int64_t(text.size()));
    EXPECT_EQ(r.bytes_consumed(), int64_t(fs::file_size(dir / name)));
  }
}

TEST(JsonlReader, BlocksHoldWholeLinesAndAreTargetSized) {
  TempDir dir("nk_jsonl");
  std::string text;
  for (int i = 0; i < 5000; ++i) text += std::string(size_t(i % 97), 'x') + "\n";
  text += std::string(3 << 20, 'y') + "\n";  // one line longer than a read chunk
  test::write_file(dir / "a.jsonl.zst", zstd_compress(text));
  JsonlReader r(dir / "a.jsonl.zst");
  LineBlock b;
  std::string joined;
  int64_t next_line = 1;
  while (r.read_block(b, 1000)) {
    EXPECT_EQ(b.first_line, next_line);
    EXPECT_EQ(b.bytes.size(), b.size + kJsonPadding);
    EXPECT_EQ(b.lines().back(), '\n');
    EXPECT_EQ(int64_t(std::count(b.lines().begin(), b.lines().end(), '\n')), b.num_lines);
    next_line += b.num_lines;
    joined += b.lines();
  }
  EXPECT_EQ(joined, text);
  EXPECT_EQ(next_line, 5002);
}

TEST(JsonlReader, TooLongLineNamesItsNumber) {
  TempDir dir("nk_jsonl");
  test::write_file(dir / "a.jsonl", "{}\n{}\n" + std::string(5000, 'z') + "\n");
  JsonlReader r(dir / "a.jsonl", 4096);
  LineBlock b;
  std::string e = error_of([&] {
    while (r.read_block(b, 10)) {
    }
  });
  EXPECT_TRUE(contains(e, "a.jsonl:3: line longer than 4096 bytes")) << e;
}

TEST(JsonlReader, TruncatedAndCorruptZstdNameFileAndOffset) {
  TempDir dir("nk_jsonl");
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "{\"text\": \"line " + std::to_string(i) + "\"}\n";
  std::string z = zstd_compress(text);
  auto read_all = [](const std::string& path) {  // the error reading every line gives
    return error_of([&] {
      JsonlReader r(path);
      std::string_view line;
      int64_t no;
      while (r.read_line(line, no)) {
      }
    });
  };
  test::write_file(dir / "t.zst", z.substr(0, z.size() / 2));
  std::string e = read_all(dir / "t.zst");
  EXPECT_TRUE(contains(e, dir / "t.zst")) << e;
  EXPECT_TRUE(contains(e, "truncated zstd stream")) << e;
  EXPECT_TRUE(contains(e, "compressed byte offset " + std::to_string(z.size() / 2))) << e;
  EXPECT_TRUE(contains(e, "while reading line")) << e;

  std::string bad = z;
  for (size_t i = 20; i < 60; ++i) bad[i] = char(bad[i] ^ 0x5A);
  test::write_file(dir / "c.zst", bad);
  e = read_all(dir / "c.zst");
  EXPECT_TRUE(contains(e, dir / "c.zst")) << e;
  EXPECT_TRUE(contains(e, "zstd")) << e;
}

TEST(JsonlReader, UnopenableInputsNamed) {
  TempDir dir("nk_jsonl");
  EXPECT_TRUE(contains(error_of([&] { JsonlReader r(dir / "missing.jsonl"); }),
                       dir / "missing.jsonl: cannot open"));
  EXPECT_TRUE(contains(error_of([&] { JsonlReader r(dir.path().string()); }), "is a folder"));
  test::write_file(dir / "g.jsonl.gz", "\x1f\x8b\x08\x00rest");
  EXPECT_TRUE(contains(error_of([&] { JsonlReader r(dir / "g.jsonl.gz"); }), "gzip"));
}

// ---------------------------------------------------------------------------
// JsonFieldReader and UTF-8 repair

RecordStatus read_field(JsonFieldReader& f, const std::string& line, std::string& text,
                        std::string& why) {
  std::string padded = line + std::string(kJsonPadding, ' ');
  std::string_view v;
  RecordStatus s = f.read(std::string_view(padded.data(), line.size()), v, why);
  text = std::string(v);
  return s;
}

TEST(JsonFieldReader, UnescapesUnicodeAndSurrogatePairs) {
  JsonFieldReader f("text");
  std::string text, why;
  ASSERT_EQ(read_field(f, R"({"text": "caf\u00e9 \u4e2d \ud83d\ude00 \"q\" \\ \n\t\/ \u0000!"})",
                       text, why),
            RecordStatus::Ok)
      << why;
  EXPECT_EQ(text, std::string("caf\xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80 \"q\" \\ \n\t/ ") +
                      std::string(1, '\0') + "!");
  ASSERT_EQ(read_field(f, "{\"a\":1,\"text\":\"raw \xC3\xA9\"}", text, why), RecordStatus::Ok);
  EXPECT_EQ(text, "raw \xC3\xA9");
  ASSERT_EQ(read_field(f, R"({"text": ""})", text, why), RecordStatus::Ok);
  EXPECT_EQ(text, "");
}

TEST(JsonFieldReader, EachBadRecordHasItsCause) {
  JsonFieldReader f("text");
  std::string text, why;
  EXPECT_EQ(read_field(f, R"({"text": "a")", text, why), RecordStatus::InvalidJson);
  EXPECT_EQ(read_field(f, R"({"text": "a"} trailing)", text, why), RecordStatus::InvalidJson);
  EXPECT_EQ(read_field(f, R"(["text"])", text, why), RecordStatus::InvalidJson);
  EXPECT_TRUE(contains(why, "an array, not a JSON object")) << why;
  EXPECT_EQ(read_field(f, R"({"text": "lone \ud800 surrogate"})", text, why),
            RecordStatus::InvalidJson);
  EXPECT_TRUE(contains(why, "surrogate")) << why;
  EXPECT_EQ(read_field(f, R"({"body": "a"})", text, why), RecordStatus::MissingKey);
  EXPECT_TRUE(contains(why, "no key \"text\"")) << why;
  EXPECT_EQ(read_field(f, R"({"text": 12})", text, why), RecordStatus::NotString);
  EXPECT_TRUE(contains(why, "a number, not a string")) << why;
  EXPECT_EQ(read_field(f, R"({"text": null})", text, why), RecordStatus::NotString);
  EXPECT_EQ(read_field(f, "{\"text\": \"ab\xFF\"}", text, why), RecordStatus::InvalidUtf8);
  EXPECT_TRUE(contains(why, "byte 12")) << why;
}

TEST(Utf8, ReplacesMaximalSubparts) {
  auto fix = [](const std::string& s) {
    std::string out;
    append_replacing_invalid_utf8(s, out);
    return out;
  };
  const std::string R = "\xEF\xBF\xBD";
  // Unicode 15, section 3.9, table 3-8's example.
  EXPECT_EQ(fix("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a" + R + R + R + "b" + R + "c" + R + R + "d");
  EXPECT_EQ(fix("\xED\xA0\x80"), R + R + R);  // a surrogate: no maximal subpart longer than 1
  EXPECT_EQ(fix("\xC0\xAF"), R + R);          // overlong
  EXPECT_EQ(fix("ok\xE2\x82"), "ok" + R);     // cut at the end
  EXPECT_EQ(fix("\xF4\x90\x80\x80"), R + R + R + R);  // above U+10FFFF
  EXPECT_EQ(fix("\xE2\x82\xAC \xF0\x9F\x98\x80"), "\xE2\x82\xAC \xF0\x9F\x98\x80");
}

// ---------------------------------------------------------------------------
// preprocess_jsonl

class PreprocessOrder : public ::testing::TestWithParam<bool> {};  // zstd?

TEST_P(PreprocessOrder, MatchesDirectTokenizationInInputOrder) {
  TempDir dir("nk_pre");
  auto docs_a = random_texts(1, 700), docs_b = random_texts(2, 300);
  bool zstd = GetParam();
  std::string a = dir / "a.jsonl", b = dir / "b.jsonl";
  test::write_file(a, zstd ? zstd_two_frames(to_jsonl(docs_a)) : to_jsonl(docs_a));
  test::write_file(b, zstd ? zstd_compress(to_jsonl(docs_b)) : to_jsonl(docs_b));
  std::vector<PreprocessProgress> calls;
  auto opt = options({a, b}, dir / "out");
  opt.progress_every_s = 0;
  auto st = preprocess_jsonl(opt, [&](const PreprocessProgress& p) { calls.push_back(p); });

  std::vector<std::string> all = docs_a;
  all.insert(all.end(), docs_b.begin(), docs_b.end());
  auto want = expected(all);
  test::NumpyDataset ds = read_with_numpy(dir / "out");
  EXPECT_EQ(ds.dtype, "uint16");
  ASSERT_EQ(ds.sequences.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(ds.sequences[i], want[i]) << "document " << i;
  for (size_t i = 0; i < ds.doc_idx.size(); ++i) EXPECT_EQ(ds.doc_idx[i], int64_t(i));

  int64_t tokens = 0;
  for (auto& w : want) tokens += int64_t(w.size());
  EXPECT_EQ(st.documents, int64_t(all.size()));
  EXPECT_EQ(st.tokens, tokens);
  EXPECT_EQ(st.lines, int64_t(all.size()));
  EXPECT_EQ(st.input_bytes, int64_t(fs::file_size(a) + fs::file_size(b)));
  EXPECT_EQ(st.text_bytes, int64_t(to_jsonl(docs_a).size() + to_jsonl(docs_b).size()));
  EXPECT_EQ(st.workers, 3);
  // Progress only moves forward and ends at the whole input.
  ASSERT_GT(calls.size(), 2u);
  for (size_t i = 1; i < calls.size(); ++i) {
    EXPECT_GE(calls[i].input_bytes_done, calls[i - 1].input_bytes_done);
    EXPECT_GE(calls[i].documents, calls[i - 1].documents);
  }
  EXPECT_TRUE(calls.back().finished);
  EXPECT_EQ(calls.back().input_bytes_done, calls.back().input_bytes_total);
  EXPECT_EQ(calls.back().documents, st.documents);
}

INSTANTIATE_TEST_SUITE_P(PlainAndZstd, PreprocessOrder, ::testing::Values(false, true));

TEST(Preprocess, WithoutEodAndOtherKeyAndOneWorker) {
  TempDir dir("nk_pre");
  std::string s = "{\"body\": \"first\", \"text\": 1}\n{\"body\": \"\\u00e9\\ud83d\\ude00\"}\n";
  test::write_file(dir / "a.jsonl", s);
  auto opt = options({dir / "a.jsonl"}, dir / "out");
  opt.json_key = "body";
  opt.append_eod = false;
  opt.workers = 1;
  preprocess_jsonl(opt, nullptr);
  test::NumpyDataset ds = read_with_numpy(dir / "out");
  EXPECT_EQ(ds.sequences, expected({"first", "\xC3\xA9\xF0\x9F\x98\x80"}, "bytes", false));
}

// prepend_bos: the first token of every document is the tokenizer's BOS,
// and the documents otherwise equal those without it (empty ones are still
// dropped, BOS and all).
TEST(Preprocess, PrependBosPutsTheTokenizersBosFirst) {
  TempDir dir("nk_pre");
  BpeVocab v;  // bytes, with GPT-2's <|endoftext|> and Llama 3's <|begin_of_text|>
  for (int b = 0; b < 256; ++b) v.tokens.push_back(std::string(1, char(b)));
  v.pattern = R"(\S+|\s+)";
  v.specials = {{"<|endoftext|>", 256}, {"<|begin_of_text|>", 257}};
  v.bos = "<|begin_of_text|>";
  v.name = "bytes_with_bos";
  save_bpe_tokenizer(v, dir / "tok");
  auto docs = random_texts(3, 200);
  docs.insert(docs.begin() + 5, "");
  test::write_file(dir / "a.jsonl", to_jsonl(docs));
  auto opt = options({dir / "a.jsonl"}, dir / "plain");
  opt.tokenizer = dir / "tok";
  preprocess_jsonl(opt, nullptr);
  opt.output_prefix = dir / "bos";
  opt.prepend_bos = true;
  const PreprocessStats st = preprocess_jsonl(opt, nullptr);
  const test::NumpyDataset plain = read_with_numpy(dir / "plain"),
                           bos = read_with_numpy(dir / "bos");
  ASSERT_EQ(bos.sequences.size(), plain.sequences.size());
  ASSERT_EQ(bos.sequences.size(), docs.size() - 1);
  EXPECT_EQ(st.documents, int64_t(docs.size() - 1));
  for (size_t i = 0; i < bos.sequences.size(); ++i) {
    ASSERT_GE(bos.sequences[i].size(), 3u) << "document " << i;
    EXPECT_EQ(bos.sequences[i][0], 257) << "document " << i;
    EXPECT_EQ(std::vector<int32_t>(bos.sequences[i].begin() + 1, bos.sequences[i].end()),
              plain.sequences[i])
        << "document " << i;
    EXPECT_EQ(bos.sequences[i].back(), 256) << "document " << i;  // the EOD still last
  }
  // A tokenizer without a BOS: an error naming the key, and no output.
  opt.tokenizer = "bytes";
  opt.output_prefix = dir / "none";
  const std::string e = error_of([&] { preprocess_jsonl(opt, nullptr); });
  EXPECT_TRUE(contains(e, "preprocess.prepend_bos: tokenizer 'bytes' has no beginning-of-document"))
      << e;
  EXPECT_FALSE(fs::exists(dir / "none.bin"));
  EXPECT_FALSE(fs::exists(dir / "none.idx"));
}

TEST(Preprocess, EmptyDocumentsAndBlankLinesAreDropped) {
  TempDir dir("nk_pre");
  test::write_file(dir / "a.jsonl", "{\"text\":\"a\"}\n\n  \r\n{\"text\":\"\"}\n{\"text\":\"b\"}");
  auto st = preprocess_jsonl(options({dir / "a.jsonl"}, dir / "out"), nullptr);
  EXPECT_EQ(st.documents, 2);
  EXPECT_EQ(st.empty_documents, 1);
  EXPECT_EQ(st.blank_lines, 2);
  EXPECT_EQ(st.lines, 5);
  EXPECT_EQ(read_with_numpy(dir / "out").sequences, expected({"a", "b"}));
}

struct BadCase {
  const char* name;
  std::string line;
  const char* cause;
  int64_t PreprocessStats::*counter;
};

std::vector<BadCase> bad_cases() {
  return {
      {"malformed", R"({"text": "unterminated)", "invalid JSON", &PreprocessStats::invalid_json},
      {"missing", R"({"title": "no text"})", "missing key", &PreprocessStats::missing_key},
      {"nonstring", R"({"text": ["a", "b"]})", "not a string", &PreprocessStats::not_string},
      {"utf8", "{\"text\": \"bad \xC3\x28 byte\"}", "invalid UTF-8",
       &PreprocessStats::invalid_utf8}};
}

// 40 good lines with the bad one as line 23 (and again as line 37).
std::string with_bad_lines(const std::string& bad, std::vector<std::string>& good) {
  std::string s;
  for (int i = 1; i <= 40; ++i) {
    if (i == 23 || i == 37) {
      s += bad + "\n";
    } else {
      good.push_back("doc " + std::to_string(i));
      s += "{\"text\": \"" + good.back() + "\"}\n";
    }
  }
  return s;
}

TEST(Preprocess, BadRecordStopsTheRunNamingFileAndLineAndLeavesNoOutput) {
  for (auto& c : bad_cases()) {
    for (bool zstd : {false, true}) {
      TempDir dir("nk_pre");
      std::vector<std::string> good;
      std::string text = with_bad_lines(c.line, good);
      std::string in = dir / "in.jsonl";
      test::write_file(in, zstd ? zstd_compress(text) : text);
      std::string e = error_of([&] { preprocess_jsonl(options({in}, dir / "out"), nullptr); });
      EXPECT_TRUE(contains(e, in + ":23: " + c.cause)) << c.name << ": " << e;
      EXPECT_EQ(dir.files(), std::vector<std::string>{"in.jsonl"}) << c.name;
    }
  }
}

// A prefix in folders that do not exist yet gets them, as nekton train makes
// its out_dir; a run that fails leaves none of them behind.
TEST(Preprocess, MakesTheOutputFoldersAndRemovesThemWhenItFails) {
  TempDir dir("nk_pre_dirs");
  std::vector<std::string> good;
  const std::string in = dir / "in.jsonl";
  test::write_file(in, with_bad_lines(bad_cases()[0].line, good));
  std::string e =
      error_of([&] { preprocess_jsonl(options({in}, dir / "data/new/corpus"), nullptr); });
  EXPECT_TRUE(contains(e, in + ":23:")) << e;
  EXPECT_EQ(dir.files(), std::vector<std::string>{"in.jsonl"});
  PreprocessOptions o = options({in}, dir / "data/new/corpus");
  o.skip_bad = true;
  preprocess_jsonl(o, nullptr);
  EXPECT_TRUE(std::filesystem::is_regular_file(dir / "data/new/corpus.bin"));
  EXPECT_TRUE(std::filesystem::is_regular_file(dir / "data/new/corpus.idx"));
}

TEST(Preprocess, SkipBadCountsEachCauseAndKeepsEveryGoodRecord) {
  for (auto& c : bad_cases()) {
    TempDir dir("nk_pre");
    std::vector<std::string> good;
    test::write_file(dir / "in.jsonl", with_bad_lines(c.line, good));
    auto opt = options({dir / "in.jsonl"}, dir / "out");
    opt.skip_bad = true;
    auto st = preprocess_jsonl(opt, nullptr);
    EXPECT_EQ(st.*c.counter, 2) << c.name;
    EXPECT_EQ(st.skipped_bad(), 2) << c.name;
    EXPECT_EQ(st.documents, 38) << c.name;
    ASSERT_EQ(st.skipped_examples.size(), 2u);
    EXPECT_TRUE(contains(st.skipped_examples[0], dir / "in.jsonl:23: " + c.cause))
        << st.skipped_examples[0];
    EXPECT_TRUE(contains(st.summary(), "2 bad records")) << st.summary();
    EXPECT_EQ(read_with_numpy(dir / "out").sequences, expected(good)) << c.name;
  }
}

TEST(Preprocess, InvalidUtf8ReplacedKeepsTheRecord) {
  TempDir dir("nk_pre");
  test::write_file(dir / "in.jsonl", "{\"text\": \"a\xFF\xC3\"}\n{\"text\": \"ok\"}\n");
  auto opt = options({dir / "in.jsonl"}, dir / "out");
  opt.invalid_utf8 = "replace";
  auto st = preprocess_jsonl(opt, nullptr);
  EXPECT_EQ(st.utf8_replaced_records, 1);
  EXPECT_EQ(st.documents, 2);
  EXPECT_EQ(read_with_numpy(dir / "out").sequences, expected({"a\xEF\xBF\xBD\xEF\xBF\xBD", "ok"}));
}

TEST(Preprocess, MissingOrUnreadableInputLeavesNoOutput) {
  TempDir dir("nk_pre");
  test::write_file(dir / "ok.jsonl", "{\"text\": \"a\"}\n");
  std::string e = error_of([&] {
    preprocess_jsonl(options({dir / "ok.jsonl", dir / "nope.jsonl"}, dir / "out"), nullptr);
  });
  EXPECT_TRUE(contains(e, dir / "nope.jsonl: cannot open")) << e;
  if (::geteuid() != 0) {  // root reads anything
    test::write_file(dir / "locked.jsonl", "{\"text\": \"a\"}\n");
    fs::permissions(dir / "locked.jsonl", fs::perms::none);
    e = error_of([&] { preprocess_jsonl(options({dir / "locked.jsonl"}, dir / "out"), nullptr); });
    EXPECT_TRUE(contains(e, "locked.jsonl: cannot open")) << e;
    fs::permissions(dir / "locked.jsonl", fs::perms::owner_all);
    fs::remove(dir / "locked.jsonl");
  }
  EXPECT_EQ(dir.files(), std::vector<std::string>{"ok.jsonl"});
}

TEST(Preprocess, TruncatedZstdFailsEvenWithSkipBadAndLeavesNoOutput) {
  TempDir dir("nk_pre");
  auto docs = random_texts(5, 3000);
  std::string z = zstd_compress(to_jsonl(docs));
  test::write_file(dir / "in.jsonl.zst", z.substr(0, z.size() * 2 / 3));
  auto opt = options({dir / "in.jsonl.zst"}, dir / "out");
  opt.skip_bad = true;
  opt.block_bytes = 4096;
  std::string e = error_of([&] { preprocess_jsonl(opt, nullptr); });
  EXPECT_TRUE(contains(e, dir / "in.jsonl.zst: truncated zstd stream")) << e;
  EXPECT_TRUE(contains(e, "compressed byte offset")) << e;
  EXPECT_EQ(dir.files(), std::vector<std::string>{"in.jsonl.zst"});
}

TEST(Preprocess, FormatsProgressLine) {
  PreprocessProgress p;
  p.input_bytes_total = 200'000'000;
  p.input_bytes_done = 50'000'000;
  p.text_bytes = 50'000'000;
  p.documents = 1000;
  p.seconds = 10;
  std::string s = format_progress(p, 8);
  EXPECT_EQ(s, "[##......]  25.0%  50.0 MB/200.0 MB  5.0 MB/s  100 docs/s  ETA 0:30");
}

// Peak RSS growth while preprocessing ~100 MB of JSONL must not depend on the
// input size: holding the input would take 100 MB, its int32 tokens 400 MB.
// The pipeline holds at most 2 x workers + 2 blocks (here 256 KiB of text and
// ~1 MiB of int32 tokens each), recycled through pools, plus malloc's slack
// from the first blocks' growth: ~25 MB measured.
TEST(Preprocess, MemoryStaysBoundedOnALargeInput) {
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
  // make sanitize-test: ASan keeps freed memory in a quarantine (256 MB) and
  // adds shadow memory, so the process's RSS says nothing about ours there.
  GTEST_SKIP() << "RSS bound not measurable under AddressSanitizer";
#endif
#endif
  TempDir dir("nk_pre");
  std::string in = dir / "big.jsonl";
  {
    std::ofstream f(in, std::ios::binary);
    std::string para;
    for (int i = 0; i < 40; ++i)
      para += "All work and no play makes a dull model, line " + std::to_string(i) + ". ";
    int64_t written = 0;
    for (int64_t i = 0; written < 100'000'000; ++i) {
      std::string line = "{\"id\": " + std::to_string(i) + ", \"text\": \"" +
                         para.substr(size_t(i % 500)) + "\"}\n";
      f << line;
      written += int64_t(line.size());
    }
  }
  auto opt = options({in}, dir / "out");
  opt.workers = 2;
  opt.block_bytes = 256 << 10;
  struct rusage before, after;
  getrusage(RUSAGE_SELF, &before);
  auto st = preprocess_jsonl(opt, nullptr);
  getrusage(RUSAGE_SELF, &after);
  double growth_mb = double(after.ru_maxrss - before.ru_maxrss) / 1024.0;  // ru_maxrss is KiB
  EXPECT_GE(st.text_bytes, 100'000'000);
  EXPECT_GT(st.tokens, 90'000'000);
  EXPECT_LT(growth_mb, 40.0) << "peak RSS grew by " << growth_mb << " MB on "
                             << st.text_bytes / 1000000 << " MB of input";
  std::printf("peak RSS growth %.1f MB for %.0f MB of JSONL, %.2f s (%.1f MB/s)\n", growth_mb,
              double(st.text_bytes) / 1e6, st.seconds, st.text_mb_per_s());
}

}  // namespace
}  // namespace nk
