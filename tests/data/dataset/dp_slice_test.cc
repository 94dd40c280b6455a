#include "data/dataset/dp_slice.h"

#include <gtest/gtest.h>

#include <vector>

namespace nk {
namespace {

// The ranks together read every sample of the global batch exactly once, each
// micro-batch being the single process's micro-batch m·dp + r.
TEST(DpSlice, RanksCoverTheGlobalBatchOnce) {
  const int64_t first = 40, B = 3;
  for (int64_t dp : {1, 2, 4})
    for (int64_t accum : {1, 2, 3}) {
      std::vector<int> count(size_t(dp * B * accum), 0);
      for (int64_t r = 0; r < dp; ++r)
        for (int64_t m = 0; m < accum; ++m) {
          int64_t s = dp_micro_batch_first_sample(first, m, dp, r, B);
          EXPECT_EQ(s, first + (m * dp + r) * B);
          for (int64_t b = 0; b < B; ++b) ++count[size_t(s - first + b)];
        }
      for (int c : count) EXPECT_EQ(c, 1) << "dp " << dp << " accum " << accum;
    }
}

}  // namespace
}  // namespace nk
