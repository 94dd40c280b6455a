#include "dist/mpi/buffers.h"

#include <climits>

namespace nk::dist::mpi {

MPI_Datatype element_type(DType t) {
  switch (t) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::BF16:
    case DType::F16:
      return MPI_UINT16_T;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::U8:
      return MPI_UINT8_T;
  }
  NK_CHECK(false, "dtype {}", int(t));
  return MPI_DATATYPE_NULL;
}

int mpi_count(int64_t n, const std::string& where) {
  if (n > INT_MAX)
    fail("{}: {} elements exceed one MPI call's limit of {}; split the buffer", where, n, INT_MAX);
  return int(n);
}

bool is_16bit(DType t) {
  return t == DType::BF16 || t == DType::F16;
}

void widen(const Tensor& x, float* dst) {
  int64_t n = x.numel();
  if (x.dtype() == DType::BF16) {
    const bf16* s = x.data<bf16>();
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
  } else {
    const f16* s = x.data<f16>();
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
  }
}

void narrow(const float* src, const Tensor& x, int divisor) {
  int64_t n = x.numel();
  if (x.dtype() == DType::BF16) {
    bf16* d = x.data<bf16>();
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i] / float(divisor));
  } else {
    f16* d = x.data<f16>();
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i] / float(divisor));
  }
}

void divide(const Tensor& x, int d) {
  int64_t n = x.numel();
  if (x.dtype() == DType::F32) {
    float* p = x.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] /= float(d);
  } else {
    double* p = x.data<double>();
    for (int64_t i = 0; i < n; ++i) p[i] /= double(d);
  }
}

}  // namespace nk::dist::mpi
