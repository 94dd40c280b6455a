#include "core/allocator.h"

#include <cstdlib>

#include "core/error.h"

namespace nk {

const char* device_name(Device d) {
  return d == Device::CPU ? "cpu" : "cuda";
}

Allocator& Allocator::get(Device d) {
  static Allocator cpu;
  if (d != Device::CPU) fail("device '{}' is not available in this build", device_name(d));
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
