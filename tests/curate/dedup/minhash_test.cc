#include "curate/dedup/minhash.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "curate/dedup/gcide_docs.h"

namespace nk::curate {
namespace {

using test_docs::edit_words;
using test_docs::gcide_docs;

std::vector<uint32_t> shingle_set(const MinHasher& h, const std::string& text) {
  std::vector<uint32_t> s;
  h.shingles(text, s);
  sort_unique(s);
  return s;
}

TEST(MinHash, VectorPathEqualsScalarReference) {
  for (const char* preset : {"nemo", "fineweb"}) {
    MinHashParams p;
    ASSERT_TRUE(minhash_preset(preset, p));
    MinHasher h(p);
    std::mt19937 rng(7);
    for (size_t n : {1, 2, 15, 17, 1000, 4096, 4097, 12345}) {
      std::vector<uint32_t> x(n);
      for (auto& v : x) v = uint32_t(rng());
      std::vector<uint32_t> fast(size_t(h.num_hashes())), ref(fast.size());
      h.signature(x.data(), n, fast.data());
      h.signature_scalar(x.data(), n, ref.data());
      ASSERT_EQ(fast, ref) << preset << " n=" << n;
    }
  }
}

TEST(MinHash, ShinglesAreCodePointsOrLowercasedWords) {
  MinHashParams p;
  ASSERT_TRUE(minhash_preset("nemo", p));
  MinHasher chars(p);
  auto count = [&](const MinHasher& h, const std::string& t) {
    std::vector<uint32_t> s;
    h.shingles(t, s);
    return s.size();
  };
  EXPECT_EQ(count(chars, ""), 1u);  // shorter than one shingle: the whole text
  EXPECT_EQ(count(chars, "short"), 1u);
  EXPECT_EQ(count(chars, std::string(24, 'a')), 1u);
  EXPECT_EQ(count(chars, std::string(30, 'a')), 7u);
  std::string e_acute;
  for (int i = 0; i < 30; ++i) e_acute += "\xc3\xa9";  // 30 code points, 60 bytes
  EXPECT_EQ(count(chars, e_acute), 7u);
  EXPECT_NE(shingle_set(chars, "x"), shingle_set(chars, "y"));

  ASSERT_TRUE(minhash_preset("fineweb", p));
  MinHasher words(p);
  EXPECT_EQ(count(words, "one two three"), 1u);
  EXPECT_EQ(count(words, "one two three four five six seven"), 3u);
  EXPECT_EQ(shingle_set(words, "The QUICK brown fox, jumps over; Élan"),
            shingle_set(words, "the quick brown  fox jumps\nover élan!"));
  EXPECT_NE(shingle_set(words, "the quick brown fox jumps"),
            shingle_set(words, "the quick brown fox leaps"));
}

// Each of the k signature positions agrees with probability J, independently,
// so the estimate's error has mean 0 and standard deviation sqrt(J(1-J)/k).
// Correlated hash functions would show as a larger spread (mean z^2 > 1).
TEST(MinHash, EstimateMatchesExactJaccardWithinTheBinomialBound) {
  auto docs = gcide_docs(700, 400);
  ASSERT_GE(docs.size(), 700u);
  for (const char* preset : {"nemo", "fineweb"}) {
    MinHashParams p;
    ASSERT_TRUE(minhash_preset(preset, p));
    MinHasher h(p);
    const int k = h.num_hashes();
    std::mt19937_64 rng(11);
    double sum_abs = 0, sum_err = 0, sum_var = 0, sum_z2 = 0, max_abs = 0, max_z = 0;
    int pairs = 0, informative = 0;
    std::vector<uint32_t> sa(static_cast<size_t>(k)), sb(static_cast<size_t>(k));
    for (size_t i = 0; i < docs.size(); ++i) {
      // Edit rates from 0 to 40% spread J over (0, 1]; every 10th pair is unrelated.
      double rate = 0.4 * double(i % 41) / 40.0;
      std::string other =
          i % 10 == 9 ? docs[(i + 1) % docs.size()] : edit_words(docs[i], rate, rng);
      auto a = shingle_set(h, docs[i]), b = shingle_set(h, other);
      double j = jaccard(a.data(), a.size(), b.data(), b.size());
      h.signature(docs[i], sa.data());
      h.signature(other, sb.data());
      double e = signature_similarity(sa.data(), sb.data(), k) - j;
      double var = j * (1 - j) / k;
      sum_abs += std::abs(e), sum_err += e, sum_var += var, ++pairs;
      max_abs = std::max(max_abs, std::abs(e));
      if (j > 0.02 && j < 0.98) {
        double z = e / std::sqrt(var);
        sum_z2 += z * z, ++informative;
        max_z = std::max(max_z, std::abs(z));
      }
    }
    double mae = sum_abs / pairs, bias = sum_err / pairs, mean_z2 = sum_z2 / informative;
    // Expected MAE of a normal error: sqrt(2/pi) * sigma, averaged.
    std::printf(
        "[ minhash %s k=%d ] pairs %d: MAE %.4f, max |err| %.4f, bias %+.5f, mean z^2 %.3f, "
        "max |z| %.2f\n",
        preset, k, pairs, mae, max_abs, bias, mean_z2, max_z);
    EXPECT_LT(std::abs(bias), 4 * std::sqrt(sum_var) / pairs + 1e-3);
    EXPECT_GT(mean_z2, 0.75);
    EXPECT_LT(mean_z2, 1.3);
    EXPECT_LT(max_z, 5.0);
    EXPECT_LT(mae, 0.8 * 1.25 * std::sqrt(sum_var / pairs) + 0.005);
  }
}

TEST(MinHash, PresetsAndUnknownNames) {
  MinHashParams p;
  ASSERT_TRUE(minhash_preset("nemo", p));
  EXPECT_EQ(p.num_hashes(), 260);
  EXPECT_EQ(p.ngram, 24);
  ASSERT_TRUE(minhash_preset("fineweb", p));
  EXPECT_EQ(p.num_hashes(), 112);
  EXPECT_EQ(p.kind, ShingleKind::kWords);
  EXPECT_FALSE(minhash_preset("minhash9000", p));
}

}  // namespace
}  // namespace nk::curate
