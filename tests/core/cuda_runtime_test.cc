// The CUDA runtime behind Device::CUDA (core/cuda/runtime.h): the allocator's
// byte accounting and its stream-ordered pool, host<->device copies, zeroed
// tensors, events, and the errors a user can meet (out of memory, a device
// that is not there). Every case needs a GPU: without one (or in a build
// without the CUDA backend) each is reported as skipped, never as passed.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "core/tensor.h"
#include "test_util.h"
#ifdef NK_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace nk {
namespace {

class CudaRuntime : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available(Device::CUDA))
      GTEST_SKIP() << "cuda not run: " << why_unavailable(Device::CUDA);
  }
};

#ifdef NK_WITH_CUDA

TEST_F(CudaRuntime, AllocatorCountsLiveAndPeakBytesAndReusesFreedBlocks) {
  auto& a = Allocator::get(Device::CUDA);
  const size_t live0 = a.live_bytes();
  a.reset_peak();
  {
    Tensor t = Tensor::empty({1 << 20}, DType::F32, Device::CUDA);  // 4 MiB
    EXPECT_EQ(a.live_bytes(), live0 + (4u << 20));
    Tensor u = Tensor::empty({1 << 18}, DType::BF16, Device::CUDA);  // 512 KiB
    EXPECT_EQ(a.live_bytes(), live0 + (4u << 20) + (512u << 10));
  }
  EXPECT_EQ(a.live_bytes(), live0);
  EXPECT_EQ(a.peak_bytes(), live0 + (4u << 20) + (512u << 10));
  // The freed block stays in the pool and serves the next request of its size
  // in stream order, with no synchronisation and no new driver allocation.
  const size_t reserved = cuda::reserved_bytes();
  EXPECT_GE(reserved, size_t(4) << 20);
  for (int i = 0; i < 100; ++i) Tensor::empty({1 << 20}, DType::F32, Device::CUDA);
  EXPECT_EQ(cuda::reserved_bytes(), reserved);
}

TEST_F(CudaRuntime, CopiesRoundTripAndZerosAreZero) {
  std::vector<float> src(1000003);
  std::iota(src.begin(), src.end(), -5.f);
  Tensor d = Tensor::empty({int64_t(src.size())}, DType::F32, Device::CUDA);
  cuda::copy_from_host(d.raw(), src.data(), d.nbytes());
  Tensor e = Tensor::empty(d.shape(), DType::F32, Device::CUDA);
  cuda::copy_on_device(e.raw(), d.raw(), d.nbytes());
  std::vector<float> back(src.size(), 0.f);
  cuda::copy_to_host(back.data(), e.raw(), e.nbytes());
  EXPECT_EQ(back, src);

  Tensor z = Tensor::zeros({3, 333}, DType::BF16, Device::CUDA);
  std::vector<uint16_t> zb(999, 0xffff);
  cuda::copy_to_host(zb.data(), z.raw(), z.nbytes());
  EXPECT_EQ(zb, std::vector<uint16_t>(999, 0));
}

TEST_F(CudaRuntime, EventsTimeWorkOnTheComputeStream) {
  Tensor t = Tensor::empty({64 << 20}, DType::F32, Device::CUDA);  // 256 MiB
  cuda::Event start(true), stop(true);
  start.record(cuda::stream());
  cuda::memset_zero(t.raw(), t.nbytes());
  stop.record(cuda::stream());
  stop.synchronize();
  EXPECT_GT(stop.elapsed_ms(start), 0.f);
  // A second stream waits for the compute stream through an event.
  cuda::Stream side;
  side.wait(stop.get());
  side.synchronize();
}

TEST_F(CudaRuntime, OutOfMemoryIsAnErrorNamingTheSizeAndThePool) {
  const int64_t huge = int64_t(1) << 50;  // 1 PiB of bytes
  try {
    Tensor::empty({huge}, DType::U8, Device::CUDA);
    FAIL() << "1 PiB allocated";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(test::contains(msg, "CUDA out of memory")) << msg;
    EXPECT_TRUE(test::contains(msg, std::to_string(huge) + " bytes")) << msg;
    EXPECT_TRUE(test::contains(msg, "reserved")) << msg;
  }
  // The device is still usable afterwards.
  Tensor ok = Tensor::zeros({16}, DType::F32, Device::CUDA);
  float h[16];
  cuda::copy_to_host(h, ok.raw(), sizeof(h));
  EXPECT_EQ(h[15], 0.f);
}

TEST_F(CudaRuntime, DescribesTheDevice) {
  const std::string d = cuda::device_description();
  EXPECT_TRUE(test::contains(d, "cuda:")) << d;
  EXPECT_TRUE(test::contains(d, "sm_")) << d;
}

#endif  // NK_WITH_CUDA

// Without a usable GPU, asking for CUDA memory is an error that says why.
TEST(CudaUnavailable, AllocatingIsAnErrorSayingWhy) {
  if (device_available(Device::CUDA)) GTEST_SKIP() << "this machine has a GPU";
  try {
    Tensor::empty({4}, DType::F32, Device::CUDA);
    FAIL() << "cuda memory without a GPU";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "device 'cuda' is not available")) << e.what();
    EXPECT_TRUE(test::contains(e.what(), why_unavailable(Device::CUDA))) << e.what();
  }
}

}  // namespace
}  // namespace nk
