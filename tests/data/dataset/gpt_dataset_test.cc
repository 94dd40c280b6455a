// GPTDataset: Megatron's split, document/sample/shuffle indices and their cache.
#include "data/dataset/gpt_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "data/dataset/gpt_test_data.h"
#include "test_util.h"

namespace nk {
namespace {

using test::error_of;
using test::TempDir;
namespace fs = std::filesystem;

GPTDatasetConfig config(DataSplit which, int64_t T, int64_t n, uint64_t seed,
                        const std::string& cache_dir, const std::string& split = "969,30,1") {
  GPTDatasetConfig c;
  c.split = split;
  c.which = which;
  c.seq_len = T;
  c.num_samples = n;
  c.seed = seed;
  c.cache_dir = cache_dir;
  return c;
}

TEST(GPTSplit, ParseNormalisesAndPads) {
  auto f = parse_split("969,30,1");
  EXPECT_DOUBLE_EQ(f[0], 0.969);
  EXPECT_DOUBLE_EQ(f[1], 0.03);
  EXPECT_DOUBLE_EQ(f[2], 0.001);
  auto g = parse_split(" 8, 2 ");
  EXPECT_DOUBLE_EQ(g[0], 0.8);
  EXPECT_DOUBLE_EQ(g[1], 0.2);
  EXPECT_EQ(g[2], 0.0);
  EXPECT_NE(error_of([] { parse_split("1,2,3,4"); }).find("4 parts"), std::string::npos);
  EXPECT_NE(error_of([] { parse_split("1,x,3"); }).find("'x' is not a number"), std::string::npos);
  EXPECT_NE(error_of([] { parse_split("1,-2,3"); }).find("negative"), std::string::npos);
  EXPECT_NE(error_of([] { parse_split("0,0"); }).find("sum to zero"), std::string::npos);
  EXPECT_NE(error_of([] { parse_split(""); }).find("not a number"), std::string::npos);
}

TEST(GPTSplit, BoundariesAreDisjointAndCoverAllDocuments) {
  auto b = split_boundaries(parse_split("969,30,1"), 1000);
  EXPECT_EQ(b, (std::array<int64_t, 4>{0, 969, 999, 1000}));
  for (const char* s : {"969,30,1", "1,1,1", "98,2,0", "1", "0,1,0", "333,333,334", "7,2,1"}) {
    for (int64_t n : {0, 1, 2, 3, 5, 10, 17, 100, 1001}) {
      auto f = parse_split(s);
      auto bb = split_boundaries(f, n);
      EXPECT_EQ(bb[0], 0) << s << " n=" << n;
      EXPECT_EQ(bb[3], n) << s << " n=" << n;
      for (int k = 0; k < 3; ++k) {
        EXPECT_LE(bb[k], bb[k + 1]) << s << " n=" << n;
        // Each part is within one document of its share.
        EXPECT_LE(std::abs(double(bb[k + 1] - bb[k]) - f[k] * double(n)), 1.5) << s << " n=" << n;
      }
    }
  }
}

TEST(GPTIndices, EpochArithmetic) {
  // (E * tpe - 1) / T >= n with E minimal.
  for (int64_t tpe : {17, 100, 1000})
    for (int64_t T : {1, 8, 16, 33})
      for (int64_t n : {1, 5, 50, 500}) {
        int64_t e = num_epochs_for(tpe, T, n);
        EXPECT_GE(samples_in_epochs(e, tpe, T), n);
        if (e > 1) {
          EXPECT_LT(samples_in_epochs(e - 1, tpe, T), n);
        }
      }
  // 1000 tokens, T = 10: 99 samples per epoch; 2.5 epochs' worth needs 3 epochs,
  // of whose last ~50 of 99 are used (< 80%): shuffled separately.
  EXPECT_EQ(num_epochs_for(1000, 10, 250), 3);
  EXPECT_TRUE(use_separate_final_epoch(3, 1000, 10, 250));
  EXPECT_FALSE(use_separate_final_epoch(3, 1000, 10, 290));  // 91 of 99 used
  EXPECT_FALSE(use_separate_final_epoch(1, 1000, 10, 50));
}

TEST(GPTIndices, ShuffleIsAPermutationAndUnbiasedBelow) {
  Rng rng(5);
  auto s = build_shuffle_index(30, 50, rng);
  ASSERT_EQ(s.size(), 50u);
  std::vector<int64_t> sorted(s.begin(), s.end());
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(sorted[size_t(i)], i);
  for (size_t i = 0; i < 30; ++i) EXPECT_LT(s[i], 30);  // the final epoch stays at the end
  for (size_t i = 30; i < 50; ++i) EXPECT_GE(s[i], 30);
  // uniform_below: each of 3 values about a third of the time.
  std::array<int, 3> c{};
  for (int i = 0; i < 30000; ++i) ++c[uniform_below(rng, 3)];
  for (int v : c) EXPECT_NEAR(v, 10000, 400);
}

// The samples of one epoch, in unshuffled order, walk the documents of the
// document index back to back: every token once, consecutive samples sharing one.
TEST(GPTDataset, OneEpochUsesEveryTokenOnceAndNeverReadsPastTheEnd) {
  TempDir dir("nk_gpt");
  auto data = IndexedDataset::open(test::write_counting_dataset(dir / "ds", 120, 40, 1));
  const int64_t T = 16;
  // How many samples one train epoch holds: ask for 1, then for all of them.
  GPTDataset probe(data, config(DataSplit::Train, T, 1, 7, dir / "cache"));
  int64_t tpe = probe.tokens_per_epoch(), per_epoch = (tpe - 1) / T;
  GPTDataset ds(data, config(DataSplit::Train, T, per_epoch, 7, dir / "cache"));
  ASSERT_EQ(ds.num_epochs(), 1);
  ASSERT_EQ(ds.size(), per_epoch);

  // The split's tokens in document-index order.
  std::vector<int32_t> stream;
  for (int64_t doc : ds.document_index()) {
    const auto& di = data->doc_idx();
    for (int64_t s = di[size_t(doc)]; s < di[size_t(doc) + 1]; ++s) {
      auto seq = data->sequence(s);
      stream.insert(stream.end(), seq.begin(), seq.end());
    }
  }
  ASSERT_EQ(int64_t(stream.size()), tpe);
  std::vector<int32_t> buf(size_t(T + 1)), prev;
  std::set<int32_t> seen;
  for (int64_t j = 0; j < ds.size(); ++j) {
    ds.unshuffled_sample(j, buf.data());
    for (int64_t t = 0; t <= T; ++t) ASSERT_EQ(buf[size_t(t)], stream[size_t(j * T + t)]) << j;
    if (j > 0) {
      EXPECT_EQ(buf[0], prev.back());  // the one-token overlap
    }
    for (int64_t t = j > 0 ? 1 : 0; t <= T; ++t) EXPECT_TRUE(seen.insert(buf[size_t(t)]).second);
    prev = buf;
  }
  // All but the partial last sample's tokens: fewer than T left over.
  EXPECT_EQ(int64_t(seen.size()), ds.size() * T + 1);
  EXPECT_LT(tpe - int64_t(seen.size()), T);
  // Every document of the split exactly once in the document index.
  std::vector<int64_t> docs = ds.document_index();
  std::sort(docs.begin(), docs.end());
  for (int64_t k = 0; k < int64_t(docs.size()); ++k) EXPECT_EQ(docs[size_t(k)], ds.doc_begin() + k);
  // The shuffled view is a permutation of the same samples.
  std::vector<int64_t> sh = ds.shuffle_index();
  std::sort(sh.begin(), sh.end());
  for (int64_t k = 0; k < ds.size(); ++k) EXPECT_EQ(sh[size_t(k)], k);
  ds.sample(0, buf.data());
  std::vector<int32_t> want(size_t(T + 1));
  ds.unshuffled_sample(ds.shuffle_index()[0], want.data());
  EXPECT_EQ(buf, want);
}

TEST(GPTDataset, ManyEpochsAndASeparateFinalEpoch) {
  TempDir dir("nk_gpt");
  auto data = IndexedDataset::open(test::write_counting_dataset(dir / "ds", 60, 30, 2));
  const int64_t T = 8;
  GPTDataset probe(data, config(DataSplit::Train, T, 1, 1, dir / "c"));
  int64_t per_epoch = (probe.tokens_per_epoch() - 1) / T;
  int64_t n_docs = probe.doc_end() - probe.doc_begin();
  // 2.3 epochs' worth: 3 epochs, the last one 30% used, so shuffled on its own.
  GPTDataset ds(data, config(DataSplit::Train, T, per_epoch * 23 / 10, 1, dir / "c"));
  ASSERT_EQ(ds.num_epochs(), 3);
  ASSERT_TRUE(ds.separate_final_epoch());
  ASSERT_GE(ds.size(), per_epoch * 23 / 10);
  const auto& di = ds.document_index();
  ASSERT_EQ(int64_t(di.size()), 3 * n_docs);
  std::vector<int64_t> first(di.begin(), di.end() - n_docs), last(di.end() - n_docs, di.end());
  std::sort(first.begin(), first.end());
  std::sort(last.begin(), last.end());
  for (int64_t k = 0; k < n_docs; ++k) {
    EXPECT_EQ(last[size_t(k)], ds.doc_begin() + k);
    EXPECT_EQ(first[size_t(2 * k)], ds.doc_begin() + k);
    EXPECT_EQ(first[size_t(2 * k + 1)], ds.doc_begin() + k);
  }
  // Samples from the final epoch come after all the others in the shuffle.
  int64_t before_final = samples_in_epochs(2, ds.tokens_per_epoch(), T);
  for (int64_t i = 0; i < ds.size(); ++i)
    EXPECT_EQ(ds.shuffle_index()[size_t(i)] < before_final, i < before_final) << i;
  // Every sample reads cleanly (no read past the data; seq_len + 1 tokens).
  std::vector<int32_t> buf(size_t(T + 1));
  for (int64_t i = 0; i < ds.size(); ++i) ds.sample(i, buf.data());
  const auto& si = ds.sample_index();
  EXPECT_LT(si[si.size() - 2], int64_t(di.size()));

  // 1.9 epochs' worth: the last epoch is 90% used and shuffled with the rest.
  GPTDataset ds2(data, config(DataSplit::Train, T, per_epoch * 19 / 10, 1, dir / "c"));
  EXPECT_EQ(ds2.num_epochs(), 2);
  EXPECT_FALSE(ds2.separate_final_epoch());
}

TEST(GPTDataset, SplitsAreDisjointAndCoverTheData) {
  TempDir dir("nk_gpt");
  auto data = IndexedDataset::open(test::write_counting_dataset(dir / "ds", 200, 30, 3));
  std::set<int32_t> tokens[3];
  int64_t covered = 0, prev_end = 0;
  for (DataSplit s : {DataSplit::Train, DataSplit::Valid, DataSplit::Test}) {
    GPTDataset ds(data, config(s, 4, 10, 1, dir / "c", "80,15,5"));
    EXPECT_EQ(ds.doc_begin(), prev_end);
    prev_end = ds.doc_end();
    covered += ds.doc_end() - ds.doc_begin();
    for (int64_t d : ds.document_index()) {
      EXPECT_GE(d, ds.doc_begin());
      EXPECT_LT(d, ds.doc_end());
    }
    std::vector<int32_t> buf(5);
    for (int64_t i = 0; i < ds.size(); ++i) {
      ds.sample(i, buf.data());
      tokens[int(s)].insert(buf.begin(), buf.end());
    }
  }
  EXPECT_EQ(covered, 200);
  EXPECT_EQ(prev_end, 200);
  for (int a = 0; a < 3; ++a)
    for (int b = a + 1; b < 3; ++b)
      for (int32_t t : tokens[a]) EXPECT_FALSE(tokens[b].count(t)) << a << " " << b;
}

TEST(GPTDataset, SameSeedSameIndicesOtherSeedOther) {
  TempDir dir("nk_gpt");
  auto data = IndexedDataset::open(test::write_counting_dataset(dir / "ds", 100, 30, 4));
  // Separate cache folders, so each is built, not loaded.
  GPTDataset a(data, config(DataSplit::Train, 8, 300, 42, dir / "a"));
  GPTDataset b(data, config(DataSplit::Train, 8, 300, 42, dir / "b"));
  GPTDataset c(data, config(DataSplit::Train, 8, 300, 43, dir / "c"));
  EXPECT_FALSE(a.loaded_from_cache() || b.loaded_from_cache() || c.loaded_from_cache());
  EXPECT_EQ(a.document_index(), b.document_index());
  EXPECT_EQ(a.sample_index(), b.sample_index());
  EXPECT_EQ(a.shuffle_index(), b.shuffle_index());
  EXPECT_NE(a.document_index(), c.document_index());
  EXPECT_NE(a.shuffle_index(), c.shuffle_index());
  EXPECT_NE(a.cache().hash(), c.cache().hash());
}

TEST(GPTDataset, CacheIsReusedAndACorruptFileRebuilt) {
  TempDir dir("nk_gpt");
  auto data = IndexedDataset::open(test::write_counting_dataset(dir / "ds", 100, 30, 5));
  auto cfg = config(DataSplit::Train, 8, 200, 9, "");  // default: beside the data
  GPTDataset first(data, cfg);
  EXPECT_FALSE(first.loaded_from_cache());
  std::string shuffle_file = first.cache().path("shuffle_index");
  EXPECT_EQ(fs::path(shuffle_file).parent_path(), fs::canonical(dir.path()) / "cache");
  ASSERT_TRUE(fs::exists(shuffle_file));
  auto stamp = fs::last_write_time(shuffle_file);

  GPTDataset second(data, cfg);
  EXPECT_TRUE(second.loaded_from_cache());
  EXPECT_EQ(second.shuffle_index(), first.shuffle_index());
  EXPECT_EQ(second.sample_index(), first.sample_index());
  EXPECT_EQ(second.document_index(), first.document_index());
  EXPECT_EQ(fs::last_write_time(shuffle_file), stamp);  // loaded, not rewritten

  // Other settings: other files, the first ones untouched.
  auto other = cfg;
  other.num_samples = 201;
  GPTDataset third(data, other);
  EXPECT_FALSE(third.loaded_from_cache());
  EXPECT_NE(third.cache().path("shuffle_index"), shuffle_file);

  // A flipped byte in the payload: detected by the checksum, rebuilt, rewritten.
  std::string bytes = test::read_file(shuffle_file);
  bytes[48] ^= 0x5A;
  test::write_file(shuffle_file, bytes);
  GPTDataset fourth(data, cfg);
  EXPECT_FALSE(fourth.loaded_from_cache());
  EXPECT_EQ(fourth.shuffle_index(), first.shuffle_index());
  GPTDataset fifth(data, cfg);
  EXPECT_TRUE(fifth.loaded_from_cache());

  // A truncated file and a file of garbage: rebuilt too.
  std::string sample_file = first.cache().path("sample_index");
  bytes = test::read_file(sample_file);
  test::write_file(sample_file, bytes.substr(0, bytes.size() / 2));
  GPTDataset sixth(data, cfg);
  EXPECT_FALSE(sixth.loaded_from_cache());
  EXPECT_EQ(sixth.sample_index(), first.sample_index());
  test::write_file(sample_file, "not an index");
  GPTDataset seventh(data, cfg);
  EXPECT_FALSE(seventh.loaded_from_cache());
  EXPECT_TRUE(GPTDataset(data, cfg).loaded_from_cache());
}

TEST(GPTDataset, UnwritableCacheFolderKeepsIndicesInMemory) {
  TempDir dir("nk_gpt");
  auto data = IndexedDataset::open(test::write_counting_dataset(dir / "ds", 50, 30, 6));
  test::write_file(dir / "blocker", "a file where the cache folder would go");
  GPTDataset ds(data, config(DataSplit::Train, 8, 20, 1, dir / "blocker/cache"));
  EXPECT_FALSE(ds.loaded_from_cache());
  EXPECT_GE(ds.size(), 20);
}

TEST(GPTDataset, ErrorsNameTheDataset) {
  TempDir dir("nk_gpt");
  std::string prefix = test::write_counting_dataset(dir / "small", 10, 8, 7);
  auto data = IndexedDataset::open(prefix);
  // seq_len larger than the split's tokens.
  std::string msg = error_of([&] { GPTDataset(data, config(DataSplit::Train, 4096, 1, 1, "")); });
  EXPECT_NE(msg.find(prefix), std::string::npos) << msg;
  EXPECT_NE(msg.find("fewer than one sample of seq_len + 1 = 4097"), std::string::npos) << msg;
  // A split with no documents.
  msg = error_of([&] { GPTDataset(data, config(DataSplit::Valid, 2, 1, 1, "", "1,0,0")); });
  EXPECT_NE(msg.find("valid split"), std::string::npos) << msg;
  EXPECT_NE(msg.find(prefix), std::string::npos) << msg;
  msg = error_of([&] { GPTDataset(data, config(DataSplit::Train, 2, 1, 1, "", "1,2,3,4")); });
  EXPECT_NE(msg.find("4 parts"), std::string::npos) << msg;
  msg = error_of([&] { GPTDataset(data, config(DataSplit::Train, 0, 1, 1, "")); });
  EXPECT_NE(msg.find("seq_len must be positive"), std::string::npos) << msg;
}

}  // namespace
}  // namespace nk
