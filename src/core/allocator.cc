#include "core/allocator.h"

#include <cstdlib>

#include "core/error.h"
#ifdef NK_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace nk {

const char* device_name(Device d) {
  return d == Device::CPU ? "cpu" : "cuda";
}

Device parse_device(const std::string& name, const std::string& key) {
  Device d;
  if (name == "cpu")
    d = Device::CPU;
  else if (name == "cuda")
    d = Device::CUDA;
  else
    fail("{}: unknown device '{}' (expected cpu or cuda)", key, name);
  if (!device_available(d))
    fail("{}: device '{}' is not available: {}", key, name, why_unavailable(d));
  return d;
}

bool device_available(Device d) {
#ifdef NK_WITH_CUDA
  if (d == Device::CUDA) {
    static const bool has_gpu = cuda::device_count() > 0;
    return has_gpu;
  }
#endif
  return d == Device::CPU;
}

std::string why_unavailable(Device d) {
  if (device_available(d)) return "";
#ifdef NK_WITH_CUDA
  return "this machine has no visible CUDA GPU";
#else
  return "this build has no CUDA backend (built without nvcc or with -DNK_WITH_CUDA=OFF)";
#endif
}

Allocator& Allocator::get(Device d) {
  static Allocator cpu(Device::CPU);
  if (d == Device::CPU) return cpu;
  if (!device_available(d))
    fail("device '{}' is not available: {}", device_name(d), why_unavailable(d));
  static Allocator gpu(Device::CUDA);
  return gpu;
}

void* Allocator::allocate(size_t bytes) {
  void* p = nullptr;
#ifdef NK_WITH_CUDA
  if (device_ == Device::CUDA) p = cuda::allocate(bytes);
#endif
  if (device_ == Device::CPU) {
    size_t rounded = (bytes + 63) / 64 * 64;
    p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
    if (rounded && !p) fail("out of memory allocating {} bytes", bytes);
  }
  size_t now = live_.fetch_add(bytes) + bytes;
  size_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void Allocator::deallocate(void* p, size_t bytes) {
#ifdef NK_WITH_CUDA
  if (device_ == Device::CUDA) cuda::deallocate(p);
#endif
  if (device_ == Device::CPU) std::free(p);
  live_.fetch_sub(bytes);
}

}  // namespace nk
