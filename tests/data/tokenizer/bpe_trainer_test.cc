// BPE training: merge order by frequency, deterministic ties, dedup of equal
// spellings, specials after the merges.
#include "data/tokenizer/bpe_trainer.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace nk {
namespace {

TEST(BpeTrainer, MergesMostFrequentPairFirst) {
  PieceCounts c{{"low", 5}, {"lower", 2}, {"newest", 6}, {"widest", 3}};
  BpeTrainOptions o;
  o.vocab_size = 256 + 4 + 1;
  o.min_frequency = 1;
  BpeVocab v = train_bpe(c, o);
  ASSERT_EQ(v.tokens.size(), 260u);
  // "es" and "st" occur 9 times (newest + widest); "es" has lower ids (e=101,s=115 vs s,t).
  EXPECT_EQ(v.tokens[256], "es");
  EXPECT_EQ(v.tokens[257], "est");  // (es, t): 9
  // then "lo" (l=108,o=111: 7) ties with "ow" (7); lower left id first.
  EXPECT_EQ(v.tokens[258], "lo");
  EXPECT_EQ(v.tokens[259], "low");
  ASSERT_EQ(v.specials.size(), 1u);
  EXPECT_EQ(v.specials[0].first, "<|endoftext|>");
  EXPECT_EQ(v.specials[0].second, 260);
}

TEST(BpeTrainer, OverlappingPairsMergeLeftToRight) {
  PieceCounts c{{"aaaa", 10}};
  BpeTrainOptions o;
  o.vocab_size = 256 + 2;
  o.specials = {};
  o.min_frequency = 1;
  BpeVocab v = train_bpe(c, o);
  // "aaaa": (a,a) x3 -> "aa aa", then (aa,aa) -> "aaaa".
  ASSERT_EQ(v.tokens.size(), 258u);
  EXPECT_EQ(v.tokens[256], "aa");
  EXPECT_EQ(v.tokens[257], "aaaa");
}

TEST(BpeTrainer, StopsAtMinFrequencyAndIsDeterministic) {
  PieceCounts c{{"ab", 3}, {"cd", 1}};
  BpeTrainOptions o;
  o.vocab_size = 300;
  o.min_frequency = 2;
  BpeVocab v = train_bpe(c, o);
  EXPECT_EQ(v.tokens.size(), 257u);  // only "ab"
  PieceCounts big;
  for (int i = 0; i < 2000; ++i)
    big[std::string("w").append(std::to_string(i * 7919 % 1000))] += 1 + i % 5;
  o.vocab_size = 400;
  EXPECT_EQ(train_bpe(big, o).tokens, train_bpe(big, o).tokens);
}

TEST(BpeTrainer, RejectsTooSmallVocab) {
  BpeTrainOptions o;
  o.vocab_size = 200;
  EXPECT_THROW(train_bpe({}, o), Error);
}

}  // namespace
}  // namespace nk
