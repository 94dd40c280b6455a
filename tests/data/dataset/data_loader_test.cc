// DataLoader: batches in sample order, shifted targets, exact resume, vocab check.
#include "data/dataset/data_loader.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "data/dataset/gpt_dataset.h"
#include "data/dataset/gpt_test_data.h"
#include "test_util.h"

namespace nk {
namespace {

using test::TempDir;

std::shared_ptr<GPTDataset> dataset(const TempDir& dir, int64_t T, int64_t n) {
  GPTDatasetConfig c;
  c.seq_len = T;
  c.num_samples = n;
  c.seed = 3;
  return std::make_shared<GPTDataset>(
      IndexedDataset::open(test::write_random_dataset(dir / "ds", 150, 50, 500, 1)), c);
}

std::vector<int32_t> host(const Tensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

TEST(DataLoader, BatchesAreConsecutiveSamplesWithShiftedTargets) {
  TempDir dir("nk_loader");
  const int64_t B = 3, T = 16;
  auto ds = dataset(dir, T, 30);
  DataLoader loader(ds, B, 500);
  Tensor x = Tensor::empty({B, T}, DType::I32), y = Tensor::empty({B, T}, DType::I32);
  std::vector<int32_t> s(size_t(T + 1));
  for (int k = 0; k < 4; ++k) {
    loader.next(x, y);
    auto xs = host(x), ys = host(y);
    for (int64_t b = 0; b < B; ++b) {
      ds->sample(k * B + b, s.data());
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(xs[size_t(b * T + t)], s[size_t(t)]);
        EXPECT_EQ(ys[size_t(b * T + t)], s[size_t(t + 1)]);
      }
    }
  }
  EXPECT_EQ(loader.consumed_samples(), 4 * B);
}

TEST(DataLoader, RestoredLoaderContinuesExactly) {
  TempDir dir("nk_loader");
  const int64_t B = 4, T = 8, k = 5;
  auto ds = dataset(dir, T, 200);
  DataLoader straight(ds, B);
  Tensor x = Tensor::empty({B, T}, DType::I32), y = Tensor::empty({B, T}, DType::I32);
  for (int i = 0; i < k; ++i) straight.next(x, y);
  int64_t saved = straight.consumed_samples();
  ASSERT_EQ(saved, k * B);

  // A fresh loader over a freshly loaded dataset (indices from the cache).
  auto ds2 = dataset(dir, T, 200);
  ASSERT_TRUE(ds2->loaded_from_cache());
  DataLoader resumed(ds2, B);
  resumed.set_consumed_samples(saved);
  Tensor x2 = Tensor::empty({B, T}, DType::I32), y2 = Tensor::empty({B, T}, DType::I32);
  for (int i = 0; i < 10; ++i) {
    straight.next(x, y);
    resumed.next(x2, y2);
    EXPECT_EQ(host(x), host(x2)) << "batch " << k + i;
    EXPECT_EQ(host(y), host(y2)) << "batch " << k + i;
  }
  EXPECT_THROW(resumed.set_consumed_samples(ds2->size() + 1), Error);
}

TEST(DataLoader, TokenOutsideVocabularyAndRunningOutAreNamed) {
  TempDir dir("nk_loader");
  auto ds = dataset(dir, 8, 10);
  DataLoader loader(ds, 2, 100);  // tokens go up to 499
  Tensor x = Tensor::empty({2, 8}, DType::I32), y = Tensor::empty({2, 8}, DType::I32);
  try {
    for (int i = 0; i < 50; ++i) loader.next(x, y);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(dir / "ds"), std::string::npos) << msg;
    EXPECT_NE(msg.find("outside the model's vocabulary [0, 100)"), std::string::npos) << msg;
  }
  DataLoader all(ds, 2);
  try {
    for (int i = 0; i <= ds->size() / 2; ++i) all.next(x, y);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of samples"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nk
