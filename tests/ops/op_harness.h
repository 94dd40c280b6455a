// Shared helpers for the op tests: the backends every op test runs on,
// random inputs, tensors from/to double vectors on any backend, comparisons
// with stated tolerances and a central finite-difference gradient check run in
// double precision on the reference implementation.
//
// Like ggml's test-backend-ops, each op test is a value-parameterised test over
// `backends()` (TEST_P on a fixture derived from BackendTest, instantiated by
// NK_INSTANTIATE_BACKENDS) that builds its inputs on dev() and compares the
// backend's result with the reference in ops/ref/: a new backend runs every op
// test by being added to backends(). Each case names the kernels it covers
// (NK_COVERS, ops/kernel_cases.h); kernel_coverage_test.cc proves that every
// kernel of ops/kernel_list.h has such a case.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "ops/kernel_cases.h"
#include "ops/ops.h"

namespace nk {

// Test names and failure messages show a backend by its name.
inline void PrintTo(Device d, std::ostream* os) {
  *os << device_name(d);
}

}  // namespace nk

namespace nk::test {

// The backends built into this binary: the CPU, and CUDA when compiled.
inline std::vector<Device> backends() {
  std::vector<Device> b = {Device::CPU};
#ifdef NK_WITH_CUDA
  b.push_back(Device::CUDA);
#endif
  return b;
}

// Fixture of the op tests: the backend under test is dev(). A backend built
// into the binary but absent from the machine (CUDA without a GPU) reports
// its cases as skipped, never as passed.
class BackendTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (!device_available(dev()))
      GTEST_SKIP() << device_name(dev()) << " backend not run: " << why_unavailable(dev());
  }
  Device dev() const { return GetParam(); }
};

// A copy of host tensor `t` on `device` (t itself for the CPU), through the
// device-neutral byte upload every backend implements.
inline Tensor to_device(const Tensor& t, Device device) {
  if (device == Device::CPU) return t;
  Tensor d = Tensor::empty(t.shape(), t.dtype(), device);
  ops::copy_bytes_from_host(d, t.raw());
  return d;
}

// `t` readable on the host, bit for bit: t itself on the CPU, else a copy
// through the byte download every backend implements.
inline Tensor to_host(const Tensor& t) {
  if (t.device() == Device::CPU) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  ops::copy_bytes_to_host(t, h.raw());
  return h;
}

inline std::vector<double> randn(size_t n, uint64_t seed, double std = 1.0) {
  Rng r(seed);
  std::vector<double> v(n);
  for (auto& x : v) x = r.normal() * std;
  return v;
}

// A tensor of `dtype` on `device` holding v (rounded to the dtype).
inline Tensor make(const Shape& shape, DType dtype, const std::vector<double>& v,
                   Device device = Device::CPU) {
  Tensor t = Tensor::empty(shape, dtype);
  NK_CHECK(size_t(t.numel()) == v.size(), "make: {} values for {}", v.size(), t.desc());
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dtype) {
      case DType::F32:
        t.data<float>()[i] = float(v[i]);
        break;
      case DType::BF16:
        t.data<bf16>()[i] = f32_to_bf16(float(v[i]));
        break;
      case DType::F16:
        t.data<f16>()[i] = f32_to_f16(float(v[i]));
        break;
      case DType::F64:
        t.data<double>()[i] = v[i];
        break;
      case DType::I32:
        t.data<int32_t>()[i] = int32_t(v[i]);
        break;
      default:
        NK_CHECK(false, "make: dtype {}", dtype_name(dtype));
    }
  }
  return to_device(t, device);
}

// An i32 tensor on `device` (token ids, positions, slots, cu_seqlens).
inline Tensor make_i32(const Shape& shape, const std::vector<int32_t>& v,
                       Device device = Device::CPU) {
  Tensor t = Tensor::empty(shape, DType::I32);
  NK_CHECK(size_t(t.numel()) == v.size(), "make_i32: {} values for {}", v.size(), t.desc());
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return to_device(t, device);
}

// The elements of t (on any backend) as doubles.
inline std::vector<double> values(const Tensor& dt) {
  const Tensor t = to_host(dt);
  std::vector<double> v(t.numel());
  for (size_t i = 0; i < v.size(); ++i) {
    switch (t.dtype()) {
      case DType::F32:
        v[i] = t.data<float>()[i];
        break;
      case DType::BF16:
        v[i] = bf16_to_f32(t.data<bf16>()[i]);
        break;
      case DType::F16:
        v[i] = f16_to_f32(t.data<f16>()[i]);
        break;
      case DType::F64:
        v[i] = t.data<double>()[i];
        break;
      case DType::I32:
        v[i] = t.data<int32_t>()[i];
        break;
      default:
        NK_CHECK(false, "values: dtype {}", dtype_name(t.dtype()));
    }
  }
  return v;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Round values as storing them in `dtype` would (inputs the fast op sees).
inline std::vector<double> rounded(const std::vector<double>& v, DType dtype) {
  return values(make({int64_t(v.size())}, dtype, v));
}

// Tolerances for comparing a fast op against the double reference fed the same
// (already rounded) inputs. fp32: accumulation-order error only. bf16: one
// rounding of the output (2^-8 relative) plus bf16 intermediates.
struct Tol {
  double rel, abs;
};
inline Tol tol_for(DType t) {
  switch (t) {
    case DType::F32:
      return {1e-4, 1e-5};
    case DType::BF16:
      return {2e-2, 2e-2};
    case DType::F16:
      return {4e-3, 4e-3};
    default:
      return {1e-12, 1e-12};
  }
}

// Every element: |got - want| <= abs + rel * max|want| (scale-aware, as a
// relative error of the whole tensor), plus slack[i] where given (a bound of
// element i's own, e.g. a rounding error replayed in double) and, with
// bf16_ulp, one bf16 ulp of the larger of the two (an output rounded once to
// bf16: 2^(e - 8) for |v| in [2^(e-1), 2^e)); reports the first few
// mismatches.
inline void expect_close(const std::vector<double>& got, const std::vector<double>& want, Tol tol,
                         const char* what, const std::vector<double>& slack = {},
                         bool bf16_ulp = false) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double lim = tol.abs + tol.rel * scale + (slack.empty() ? 0 : slack[i]);
    if (bf16_ulp) {
      int e = 0;
      std::frexp(std::max(std::fabs(got[i]), std::fabs(want[i])), &e);
      lim += std::ldexp(1.0, e - 8);
    }
    if (!(std::fabs(got[i] - want[i]) <= lim)) {
      if (++bad <= 5)
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i]
                      << " (limit " << lim << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements differ";
}

// Finite-difference check of an analytic gradient. `loss(x)` returns a scalar
// (typically sum(forward(x) * dy) for a fixed random dy); `grad` is the analytic
// d loss / d x. Central differences in double with step h; relative error
// bound `rel` against the gradient's scale.
inline void check_grad_fd(const std::function<double(const std::vector<double>&)>& loss,
                          std::vector<double> x, const std::vector<double>& grad, const char* what,
                          double h = 1e-6, double rel = 1e-6, size_t max_checks = 64) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  double scale = 1e-12;
  for (double g : grad) scale = std::max(scale, std::fabs(g));
  size_t stride = std::max<size_t>(1, x.size() / max_checks);
  for (size_t i = 0; i < x.size(); i += stride) {
    double x0 = x[i];
    x[i] = x0 + h;
    double lp = loss(x);
    x[i] = x0 - h;
    double lm = loss(x);
    x[i] = x0;
    double fd = (lp - lm) / (2 * h);
    EXPECT_NEAR(grad[i], fd, rel * scale + 1e-9) << what << "[" << i << "]";
  }
}

}  // namespace nk::test

// Runs the TEST_P tests of fixture `suite` (derived from test::BackendTest) on
// every backend, each named by its device ("Backends/suite.Test/cpu").
#define NK_INSTANTIATE_BACKENDS(suite)                                                   \
  INSTANTIATE_TEST_SUITE_P(Backends, suite, ::testing::ValuesIn(::nk::test::backends()), \
                           [](const ::testing::TestParamInfo<::nk::Device>& info) {      \
                             return std::string(::nk::device_name(info.param));          \
                           })
