#include "core/tensor.h"
#ifdef NK_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

#include <fmt/ranges.h>

#include <cstring>

#include "core/limits.h"

namespace nk {

std::string shape_str(const Shape& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n = checked_mul(n, d, "tensor size");
  return n;
}

Storage::~Storage() {
  if (owned && data) Allocator::get(device).deallocate(data, bytes);
}

static Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    st[i] = s;
    s *= shape[i];
  }
  return st;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (auto d : shape) NK_CHECK(d >= 0, "negative dimension in {}", shape_str(shape));
  Tensor t;
  t.storage_ = std::make_shared<Storage>();
  t.storage_->bytes = size_t(checked_mul(shape_numel(shape), dtype_size(dtype), "tensor bytes"));
  t.storage_->device = device;
  t.storage_->owned = true;
  t.storage_->data = Allocator::get(device).allocate(t.storage_->bytes);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
#ifdef NK_WITH_CUDA
  if (device == Device::CUDA) {
    cuda::memset_zero(t.raw(), t.nbytes());
    return t;
  }
#endif
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>();
  t.storage_->data = data;
  t.storage_->bytes = size_t(checked_mul(shape_numel(shape), dtype_size(dtype), "tensor bytes"));
  t.storage_->device = device;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  if (i < 0) i += n;
  NK_CHECK(i >= 0 && i < n, "dim {} out of range for {}", i, desc());
  return shape_[i];
}

bool Tensor::is_contiguous() const {
  return strides_ == contiguous_strides(shape_);
}

std::string Tensor::desc() const {
  return fmt::format("{}{}", dtype_name(dtype_), shape_str(shape_));
}

Tensor Tensor::view(const Shape& shape) const {
  NK_CHECK(is_contiguous(), "view of non-contiguous {}", desc());
  Shape s = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      NK_CHECK(infer < 0, "two -1 in view {}", shape_str(shape));
      infer = int(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[infer] = known ? numel() / known : 0;
  NK_CHECK(shape_numel(s) == numel(), "cannot view {} as {}", desc(), shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::narrow0(int64_t start, int64_t len) const {
  NK_CHECK(ndim() >= 1 && start >= 0 && len >= 0 && start + len <= shape_[0],
           "narrow0({}, {}) of {}", start, len, desc());
  Tensor t = *this;
  t.offset_ += size_t(start * strides_[0]) * dtype_size(dtype_);
  t.shape_[0] = len;
  return t;
}

void check_shape(const Tensor& t, const Shape& expected, const char* name) {
  NK_CHECK(t.shape() == expected, "{} has shape {}, expected {}", name, shape_str(t.shape()),
           shape_str(expected));
}

void check_dtype(const Tensor& t, DType expected, const char* name) {
  NK_CHECK(t.dtype() == expected, "{} is {}, expected {}", name, dtype_name(t.dtype()),
           dtype_name(expected));
}

}  // namespace nk
