// The device-neutral op front (ops/dispatch.h): a device without a kernel is
// an nk::Error naming the op and the device; tensors on different devices, and
// a missing required tensor, are errors naming the tensors. The foreign device
// is a host buffer tagged CUDA (Tensor::from_blob): the front must refuse it
// before any kernel could read it. Ops without a kernel are those of a build
// without CUDA (every op) or, with CUDA, the CPU-only quantised ones.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ops/dispatch.h"
#include "ops/ops.h"
#include "test_util.h"
#ifdef NK_WITH_CUDA
#include "ops/cuda/kernels.h"
#endif

namespace nk {
namespace {

// A tensor tagged CUDA over a host buffer that outlives it.
struct Foreign {
  std::vector<float> buf;
  Tensor t;
  explicit Foreign(const Shape& s, DType dt = DType::F32)
      : buf(size_t(shape_numel(s)) * 2), t(Tensor::from_blob(buf.data(), s, dt, Device::CUDA)) {}
};

#ifndef NK_WITH_CUDA

TEST(Dispatch, DeviceWithoutKernelIsAnErrorNamingOpAndDevice) {
  Foreign x({4, 8}), y({4, 8}), w({6, 8}), out({4, 6});
  const std::string gelu = test::error_of([&] { ops::gelu_forward(y.t, x.t); });
  EXPECT_TRUE(test::contains(gelu, "gelu_forward")) << gelu;
  EXPECT_TRUE(test::contains(gelu, "cuda")) << gelu;
  const std::string lin = test::error_of([&] { ops::linear_forward(out.t, x.t, w.t, Tensor()); });
  EXPECT_TRUE(test::contains(lin, "linear_forward") && test::contains(lin, "cuda")) << lin;
  const std::string fill = test::error_of([&] { ops::fill(x.t, 1.f); });
  EXPECT_TRUE(test::contains(fill, "fill") && test::contains(fill, "cuda")) << fill;
  Foreign qkv({1, 4, 48}), o({1, 4, 16}), lse({1, 2, 4});
  const std::string att =
      test::error_of([&] { ops::attention_forward(o.t, lse.t, qkv.t, 2, 2, Tensor(), 3); });
  EXPECT_TRUE(test::contains(att, "attention_forward") && test::contains(att, "cuda")) << att;
}

#else  // NK_WITH_CUDA

// cuBLASLt is opened at the first GEMM, not at start (its initialisers cost
// every process half a second): a process that has run no GEMM has not
// mapped it, and opening it finds the library of the build's major version.
TEST(Dispatch, CublasLtIsOpenedAtFirstUseNotAtStart) {
  const auto mapped = [] {
    std::ifstream maps("/proc/self/maps");
    const std::string all((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
    return test::contains(all, "libcublasLt");
  };
  // Without a GPU no test of this process can have run a GEMM.
  if (!device_available(Device::CUDA)) {
    EXPECT_FALSE(mapped());
  }
  const std::string lib = ops::cuda::cublaslt_library();
  EXPECT_TRUE(test::contains(lib, "libcublasLt.so.")) << lib;
  EXPECT_TRUE(test::contains(lib, "(version ")) << lib;
  EXPECT_TRUE(mapped());
}

#endif  // NK_WITH_CUDA

TEST(Dispatch, TensorsOnDifferentDevicesAreRefused) {
  Foreign y({4, 8});
  Tensor x = Tensor::zeros({4, 8}, DType::F32);
  try {
    ops::gelu_forward(y.t, x);
    ADD_FAILURE() << "no error for mixed devices";
  } catch (const InternalError& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(test::contains(msg, "x is on cpu but y is on cuda")) << msg;
  }
}

TEST(Dispatch, MissingRequiredTensorIsRefused) {
  Tensor x = Tensor::zeros({4, 8}, DType::F32);
  try {
    ops::gelu_forward(Tensor(), x);
    ADD_FAILURE() << "no error for an undefined output";
  } catch (const InternalError& e) {
    EXPECT_TRUE(test::contains(e.what(), "gelu_forward: y is undefined")) << e.what();
  }
}

}  // namespace
}  // namespace nk
