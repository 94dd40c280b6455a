#include "core/allocator.h"

#include <cstdlib>

#include "core/error.h"

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
    fail("{}: device '{}' is not available in this build (built without CUDA)", key, name);
  return d;
}

bool device_available(Device d) {
  return d == Device::CPU;
}

Allocator& Allocator::get(Device d) {
  static Allocator cpu;
  if (!device_available(d)) fail("device '{}' is not available in this build", device_name(d));
  return cpu;
}

void* Allocator::allocate(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
  if (rounded && !p) fail("out of memory allocating {} bytes", bytes);
  size_t now = live_.fetch_add(bytes) + bytes;
  size_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void Allocator::deallocate(void* p, size_t bytes) {
  std::free(p);
  live_.fetch_sub(bytes);
}

}  // namespace nk
