#include "core/limits.h"

#include <gtest/gtest.h>

#include "core/tensor.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::error_of;

TEST(Limits, CheckedArithmeticReportsOverflowInsteadOfWrapping) {
  EXPECT_EQ(checked_mul(int64_t(1) << 31, int64_t(1) << 31, "x"), int64_t(1) << 62);
  EXPECT_EQ(checked_mul(-4, 5, "x"), -20);
  EXPECT_EQ(checked_add(INT64_MAX - 1, 1, "x"), INT64_MAX);
  EXPECT_EQ(error_of([] { checked_mul(int64_t(1) << 32, int64_t(1) << 32, "tensor size"); }),
            "tensor size: 4294967296 x 4294967296 overflows a 64-bit size");
  EXPECT_TRUE(contains(error_of([] { checked_add(INT64_MAX, 1, "parameters"); }),
                       "parameters: 9223372036854775807 + 1 overflows"));
}

TEST(Limits, CheckLimitNamesWhereKeyValueAndLimit) {
  check_limit("f.json", "n_layer", limits::kLayers, limits::kLayers, "layers");  // the bound itself
  EXPECT_EQ(error_of([] { check_limit("f.json", "n_layer", 5000, 4096, "layers"); }),
            "f.json: n_layer = 5000 is beyond the limit of 4096 layers");
  EXPECT_EQ(error_of([] { check_limit("", "train.steps", -1, 10, "steps"); }),
            "train.steps = -1 is beyond the limit of 10 steps");
}

// A shape whose element count or byte size overflows is an error, not a
// wrapped size and a small allocation that later ops overrun.
TEST(Limits, TensorSizesAreChecked) {
  EXPECT_TRUE(contains(error_of([] {
                         shape_numel({int64_t(1) << 40, int64_t(1) << 40});
                       }),
                       "tensor size"));
  EXPECT_TRUE(contains(error_of([] {
                         Tensor::empty({int64_t(1) << 31, int64_t(1) << 31}, DType::F32);
                       }),
                       "tensor bytes"));
}

}  // namespace
}  // namespace nk
