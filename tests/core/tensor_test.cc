#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/parallel.h"

namespace nk {

TEST(Tensor, ShapeViewNarrow) {
  Tensor t = Tensor::zeros({4, 6}, DType::F32);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dim(-1), 6);
  EXPECT_TRUE(t.is_contiguous());
  Tensor v = t.view({2, -1});
  EXPECT_EQ(v.shape(), (Shape{2, 12}));
  Tensor n = t.narrow0(1, 2);
  EXPECT_EQ(n.shape(), (Shape{2, 6}));
  EXPECT_EQ(static_cast<char*>(n.raw()) - static_cast<char*>(t.raw()), 6 * 4);
  EXPECT_THROW(t.view({5, 5}), InternalError);
  EXPECT_THROW(t.data<bf16>(), InternalError);
}

TEST(Allocator, CountsLiveAndPeakBytes) {
  auto& a = Allocator::get(Device::CPU);
  size_t live0 = a.live_bytes();
  {
    Tensor t = Tensor::empty({1000}, DType::F32);
    EXPECT_EQ(a.live_bytes(), live0 + 4000);
    EXPECT_GE(a.peak_bytes(), live0 + 4000);
  }
  EXPECT_EQ(a.live_bytes(), live0);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.00390625f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.01171875f)), 1.015625f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16RoundTrip) {
  for (float v : {0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f})
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  EXPECT_EQ(f32_to_f16(1.0f).bits, 0x3c00);
}

TEST(Parallel, CoversRangeOnce) {
  std::vector<int> hits(1000, 0);
  parallel_for(1000, 7, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (int h : hits) EXPECT_EQ(h, 1);
}

}  // namespace nk
