#include "train/lr_schedule.h"

#include <gtest/gtest.h>

namespace nk {

TEST(LrSchedule, WarmupThenCosineToMin) {
  LrSchedule s{1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);  // (step + 1) / warmup
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);     // cosine starts at the peak
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // halfway: (max + min) / 2
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);
  for (int64_t i = 11; i < 110; ++i) EXPECT_LT(s.at(i), s.at(i - 1));
}

TEST(LrSchedule, NoWarmup) {
  LrSchedule s{2.0, 0.0, 0, 4};
  EXPECT_DOUBLE_EQ(s.at(0), 2.0);
  EXPECT_NEAR(s.at(2), 1.0, 1e-12);
}

}  // namespace nk
