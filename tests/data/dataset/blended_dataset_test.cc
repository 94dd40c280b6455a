// BlendedDataset: NeMo blend strings, Megatron's greedy blending indices,
// member sizes and the cache.
#include "data/dataset/blended_dataset.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "data/dataset/gpt_dataset.h"
#include "data/dataset/gpt_test_data.h"
#include "test_util.h"

namespace nk {
namespace {

using test::error_of;
using test::TempDir;

TEST(Blend, ParseNormalisesWeights) {
  BlendSpec b = parse_blend("0.3, data/a_text_document,0.9,/abs/b", "data.blend");
  ASSERT_EQ(b.weights.size(), 2u);
  EXPECT_DOUBLE_EQ(b.weights[0], 0.25);
  EXPECT_DOUBLE_EQ(b.weights[1], 0.75);
  EXPECT_EQ(b.prefixes[0], "data/a_text_document");
  EXPECT_EQ(b.prefixes[1], "/abs/b");
}

TEST(Blend, BadBlendsNameTheKey) {
  std::string odd = error_of([] { parse_blend("0.3,a,0.7", "data.blend"); });
  EXPECT_NE(odd.find("data.blend: 3 items"), std::string::npos) << odd;
  std::string neg = error_of([] { parse_blend("-0.3,a,0.7,b", "data.blend"); });
  EXPECT_NE(neg.find("data.blend: weight -0.3 of 'a' is negative"), std::string::npos) << neg;
  std::string nan = error_of([] { parse_blend("a,0.3", "data.blend"); });
  EXPECT_NE(nan.find("item 1 ('a') should be a weight"), std::string::npos) << nan;
  std::string zero = error_of([] { parse_blend("0,a,0,b", "data.blend"); });
  EXPECT_NE(zero.find("sum to zero"), std::string::npos) << zero;
  std::string empty = error_of([] { parse_blend("0.5,,0.5,b", "data.blend"); });
  EXPECT_NE(empty.find("item 2"), std::string::npos) << empty;
}

TEST(Blend, GreedyIndicesFollowTheWeightsClosely) {
  std::vector<double> w = {0.2, 0.3, 0.5};
  std::vector<int16_t> di;
  std::vector<int64_t> dsi;
  build_blending_indices(w, 5000, di, dsi);
  std::vector<int64_t> count(3, 0);
  for (size_t i = 0; i < di.size(); ++i) {
    EXPECT_EQ(dsi[i], count[size_t(di[i])]) << i;  // each member read in order
    ++count[size_t(di[i])];
    int64_t n = int64_t(i) + 1;
    if (n < 1000) continue;
    for (size_t d = 0; d < 3; ++d)
      ASSERT_NEAR(double(count[d]) / double(n), w[d], 0.005) << "after " << n << " samples";
  }
  // The greedy rule keeps every prefix within one sample of its share; the first
  // sample goes to the largest weight, ties to the lowest index.
  for (size_t d = 0; d < 3; ++d) EXPECT_LE(std::fabs(double(count[d]) - w[d] * 5000), 1.0);
  EXPECT_EQ(di[0], 2);
  build_blending_indices({0.5, 0.5}, 4, di, dsi);
  EXPECT_EQ(di, (std::vector<int16_t>{0, 1, 0, 1}));
}

struct Members {
  std::vector<std::shared_ptr<const SampleDataset>> sets;
  std::vector<std::string> ids;
};

Members gpt_members(const TempDir& dir, const std::vector<double>& w, int64_t total, int64_t T) {
  Members m;
  for (size_t d = 0; d < w.size(); ++d) {
    std::string prefix = test::write_counting_dataset(
        dir / ("ds" + std::to_string(d)), 80 + 30 * int(d), 40, d, int32_t(d) * 1000000);
    GPTDatasetConfig c;
    c.seq_len = T;
    c.num_samples = blend_member_samples(w[d], total);
    c.seed = 11;
    auto g = std::make_shared<GPTDataset>(IndexedDataset::open(prefix), c);
    m.ids.push_back(g->cache().hash_hex());
    m.sets.push_back(g);
  }
  return m;
}

TEST(BlendedDataset, RatiosSizesAndSamplesOfThreeDatasets) {
  TempDir dir("nk_blend");
  std::vector<double> w = {2, 3, 5};  // normalised to 0.2 / 0.3 / 0.5
  const int64_t total = 4000, T = 8;
  Members m = gpt_members(dir, w, total, T);
  BlendedDataset b(m.sets, w, total, dir / "cache", "BlendedDataset-train", m.ids);
  ASSERT_EQ(b.size(), total);
  EXPECT_FALSE(b.loaded_from_cache());
  std::vector<int64_t> count(3, 0);
  std::vector<int32_t> got(size_t(T + 1)), want(size_t(T + 1));
  for (int64_t i = 0; i < total; ++i) {
    size_t d = size_t(b.dataset_index()[size_t(i)]);
    ++count[d];
    b.sample(i, got.data());
    m.sets[d]->sample(b.dataset_sample_index()[size_t(i)], want.data());
    ASSERT_EQ(got, want) << i;
    EXPECT_EQ(got[0] / 1000000, int32_t(d));  // the tokens say which file they came from
  }
  for (size_t d = 0; d < 3; ++d) {
    EXPECT_NEAR(double(count[d]) / double(total), b.weights()[d], 0.005) << d;
    EXPECT_LE(count[d], m.sets[d]->size()) << d;
  }
  EXPECT_NE(b.describe(0).find("blended sample 0"), std::string::npos);

  // Built once: the same blend loads its indices.
  BlendedDataset again(m.sets, w, total, dir / "cache", "BlendedDataset-train", m.ids);
  EXPECT_TRUE(again.loaded_from_cache());
  EXPECT_EQ(again.dataset_index(), b.dataset_index());
  EXPECT_EQ(again.dataset_sample_index(), b.dataset_sample_index());
  // Other weights: other files.
  BlendedDataset other(m.sets, {3, 3, 4}, total, dir / "cache", "BlendedDataset-train", m.ids);
  EXPECT_FALSE(other.loaded_from_cache());
}

// A member that holds too few samples for its share is named.
class TinyDataset : public SampleDataset {
 public:
  int64_t size() const override { return 10; }
  int64_t seq_len() const override { return 4; }
  void sample(int64_t i, int32_t* out) const override {
    for (int t = 0; t < 5; ++t) out[t] = int32_t(i);
  }
  std::string name() const override { return "tiny test dataset"; }
};

TEST(BlendedDataset, MemberTooSmallIsAnError) {
  auto tiny = std::make_shared<TinyDataset>();
  std::string msg = error_of([&] {
    BlendedDataset({tiny, tiny}, {0.5, 0.5}, 100, "", "BlendedDataset-train", {"a", "b"});
  });
  EXPECT_NE(msg.find("50 samples drawn from tiny test dataset, which holds only 10"),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace nk
