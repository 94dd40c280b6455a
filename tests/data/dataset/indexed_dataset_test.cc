// Megatron indexed dataset: byte compatibility both ways with an independent
// reader/writer (tests/data/dataset/megatron_index.py), and every corrupt file named.
#include "data/dataset/indexed_dataset.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "data/dataset/megatron_index.h"
#include "test_util.h"

namespace nk {
namespace {

using test::error_of;
using test::TempDir;
namespace fs = std::filesystem;

const std::string kPy = test::megatron_index_py();

// Random documents of 1-3 sequences each, some empty sequences, ids below `vocab`.
std::vector<std::vector<std::vector<int32_t>>> random_docs(uint64_t seed, int n, int32_t vocab) {
  Rng rng(seed);
  std::vector<std::vector<std::vector<int32_t>>> docs(n);
  for (auto& d : docs) {
    int nseq = 1 + int(rng.next_u64() % 3);
    for (int s = 0; s < nseq; ++s) {
      std::vector<int32_t> seq(rng.next_u64() % 40);
      for (auto& t : seq) t = int32_t(rng.next_u64() % uint64_t(vocab));
      d.push_back(seq);
    }
  }
  return docs;
}

class IndexedDatasetTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(IndexedDatasetTest, OurFilesReadByIndependentReader) {
  TempDir dir("nk_idx");
  int32_t vocab = GetParam();
  auto docs = random_docs(7, 50, vocab);
  std::string prefix = dir / "ds";
  IndexedDatasetWriter w(prefix, token_dtype_for_vocab(vocab));
  for (auto& d : docs) {
    for (auto& s : d) w.add_sequence(s);
    w.end_document();
  }
  w.finish();
  auto r = test::run_command(kPy + " read " + prefix, false);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["dtype"], vocab < 65500 ? "uint16" : "int32");
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int64_t> doc_idx{0};
  for (auto& d : docs) {
    for (auto& s : d) seqs.push_back(s);
    doc_idx.push_back(int64_t(seqs.size()));
  }
  EXPECT_EQ(j["sequences"].get<std::vector<std::vector<int32_t>>>(), seqs);
  EXPECT_EQ(j["doc_idx"].get<std::vector<int64_t>>(), doc_idx);
}

TEST_P(IndexedDatasetTest, IndependentWriterReadByUs) {
  TempDir dir("nk_idx");
  int32_t vocab = GetParam();
  auto docs = random_docs(11, 40, vocab);
  nlohmann::json spec = {{"dtype", vocab < 65500 ? "uint16" : "int32"}, {"documents", docs}};
  test::write_file(dir / "spec.json", spec.dump());
  std::string prefix = dir / "py";
  auto r = test::run_command(kPy + " write " + prefix + " " + (dir / "spec.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  auto ds = IndexedDataset::open(prefix);
  int64_t seq = 0, n_tok = 0;
  ASSERT_EQ(ds->num_documents(), int64_t(docs.size()));
  for (size_t d = 0; d < docs.size(); ++d) {
    EXPECT_EQ(ds->doc_idx()[d], seq);
    for (auto& s : docs[d]) {
      EXPECT_EQ(ds->sequence(seq), s) << "sequence " << seq;
      n_tok += int64_t(s.size());
      ++seq;
    }
  }
  EXPECT_EQ(ds->doc_idx().back(), seq);
  EXPECT_EQ(ds->num_sequences(), seq);
  EXPECT_EQ(ds->num_tokens(), n_tok);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, IndexedDatasetTest, ::testing::Values(50257, 100277));

// A small valid dataset in `dir`, returned as its prefix.
std::string small_dataset(const TempDir& dir, int32_t vocab = 1000) {
  std::string prefix = dir / "ds";
  IndexedDatasetWriter w(prefix, token_dtype_for_vocab(vocab));
  for (auto& d : random_docs(3, 20, vocab)) {
    for (auto& s : d) w.add_sequence(s);
    w.end_document();
  }
  w.finish();
  return prefix;
}

void truncate_file(const std::string& path, int64_t drop) {
  fs::resize_file(path, fs::file_size(path) - drop);
}

TEST(IndexedDatasetErrors, TruncatedBinNamesFileAndSizes) {
  TempDir dir("nk_idx");
  std::string p = small_dataset(dir);
  truncate_file(p + ".bin", 2);
  std::string e = error_of([&] { IndexedDataset::open(p); });
  EXPECT_NE(e.find("ds.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST(IndexedDatasetErrors, TruncatedIdxNamesFile) {
  TempDir dir("nk_idx");
  std::string p = small_dataset(dir);
  truncate_file(p + ".idx", 8);
  std::string e = error_of([&] { IndexedDataset::open(p); });
  EXPECT_NE(e.find("ds.idx"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  truncate_file(p + ".idx", fs::file_size(p + ".idx") - 5);
  e = error_of([&] { IndexedDataset::open(p); });
  EXPECT_NE(e.find("truncated header"), std::string::npos) << e;
}

TEST(IndexedDatasetErrors, BadMagicVersionDtypeAndOffsets) {
  TempDir dir("nk_idx");
  std::string p = small_dataset(dir);
  std::string good = test::read_file(p + ".idx");
  auto with = [&](size_t at, char c) {
    std::string s = good;
    s[at] = c;
    test::write_file(p + ".idx", s);
    return error_of([&] { IndexedDataset::open(p); });
  };
  EXPECT_NE(with(0, 'X').find("bad magic at byte 0"), std::string::npos);
  EXPECT_NE(with(9, 2).find("version 2 at byte 9"), std::string::npos);
  EXPECT_NE(with(17, 42).find("dtype code 42 at byte 17"), std::string::npos);
  // The second sequence's byte offset (first is always 0) no longer follows the first.
  uint64_t n_seq;
  std::memcpy(&n_seq, good.data() + 18, 8);
  size_t off1 = 34 + n_seq * 4 + 8;
  std::string e = with(off1, good[off1] + 2);
  EXPECT_NE(e.find("sequence 1 starts at byte"), std::string::npos) << e;
  EXPECT_NE(e.find("index byte " + std::to_string(off1)), std::string::npos) << e;
}

TEST(IndexedDatasetErrors, MissingFilesNamed) {
  TempDir dir("nk_idx");
  std::string e = error_of([&] { IndexedDataset::open(dir / "nothing"); });
  EXPECT_NE(e.find("nothing.idx"), std::string::npos) << e;
}

TEST(IndexedDatasetWriterTest, UnfinishedWriterLeavesNothing) {
  TempDir dir("nk_idx");
  {
    IndexedDatasetWriter w(dir / "ds", IndexDType::U16);
    std::vector<int32_t> toks{1, 2, 3};
    w.add_document(toks);
  }  // destroyed without finish(), as on an error
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(IndexedDatasetWriterTest, TokenThatDoesNotFitIsAnError) {
  TempDir dir("nk_idx");
  std::string e = error_of([&] {
    IndexedDatasetWriter w(dir / "ds", IndexDType::U16);
    std::vector<int32_t> toks{1, 70000};
    w.add_document(toks);
    w.finish();
  });
  EXPECT_NE(e.find("70000"), std::string::npos) << e;
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(IndexedDatasetWriterTest, EmptyDatasetRoundTrips) {
  TempDir dir("nk_idx");
  IndexedDatasetWriter w(dir / "ds", IndexDType::I32);
  w.finish();
  auto ds = IndexedDataset::open(dir / "ds");
  EXPECT_EQ(ds->num_sequences(), 0);
  EXPECT_EQ(ds->num_documents(), 0);
}

// Found by tests/fuzz (an ASan/UBSan finding, harmless in a plain build):
// empty sequences read into no memory at all, with and without a .bin.
TEST(IndexedDatasetEmpty, SequencesReadAsEmpty) {
  TempDir dir("nk_idx");
  for (IndexDType t : {IndexDType::I32, IndexDType::U16}) {
    IndexedDatasetWriter w(dir / "empty", t);
    w.add_document({});
    w.finish();
    EXPECT_TRUE(IndexedDataset::open(dir / "empty")->sequence(0).empty());
    IndexedDatasetWriter w2(dir / "mixed", t);
    w2.add_document(std::vector<int32_t>{1, 2});
    w2.add_document({});
    w2.finish();
    auto ds = IndexedDataset::open(dir / "mixed");
    EXPECT_EQ(ds->sequence(0), (std::vector<int32_t>{1, 2}));
    EXPECT_TRUE(ds->sequence(1).empty());
  }
}

}  // namespace
}  // namespace nk
