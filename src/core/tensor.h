// Tensor: a typed, strided view of device memory. Only kernels (src/ops/cpu,
// later src/ops/cuda) may dereference `data<T>()`; everything else moves tensors
// around and calls ops, so the same code runs on any backend.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/error.h"

namespace nk {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

// Owns (or borrows) one block of device memory.
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device = kHost;
  bool owned = false;
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
};

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised contiguous tensor from the device allocator (host memory
  // unless a device is named).
  static Tensor empty(const Shape& shape, DType dtype, Device device = kHost);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = kHost);
  // A view of memory Nekton does not own (the caller keeps it alive).
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = kHost);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int ndim() const { return int(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : kHost; }
  // Whether host code may read and write data<T>() directly.
  bool on_host() const { return device() == kHost; }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  std::string desc() const;  // "bf16[8, 256, 768]"

  // Same memory, new shape (contiguous tensors only). One entry may be -1.
  Tensor view(const Shape& shape) const;
  // Rows [start, start+len) along dimension 0.
  Tensor narrow0(int64_t start, int64_t len) const;

  // Raw element pointer, for kernels only. Checks the dtype.
  template <typename T>
  T* data() const {
    NK_CHECK(dtype_of<T>() == dtype_, "tensor is {}, accessed as {}", dtype_name(dtype_),
             dtype_name(dtype_of<T>()));
    return reinterpret_cast<T*>(raw());
  }
  void* raw() const { return storage_ ? static_cast<char*>(storage_->data) + offset_ : nullptr; }

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_, strides_;
  DType dtype_ = DType::F32;
};

// Checks used at op boundaries; they throw nk::InternalError with the tensor names.
void check_shape(const Tensor& t, const Shape& expected, const char* name);
void check_dtype(const Tensor& t, DType expected, const char* name);

}  // namespace nk
