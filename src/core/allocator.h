// Device memory with byte accounting. Every tensor's storage comes from here, so
// `live_bytes()` and `peak_bytes()` are the true footprint of Nekton's tensors.
#pragma once
#include <atomic>
#include <cstddef>

namespace nk {

enum class Device : uint8_t { CPU, CUDA };
const char* device_name(Device d);

class Allocator {
 public:
  // The allocator for `d`; throws nk::Error for a device this build lacks.
  static Allocator& get(Device d);

  void* allocate(size_t bytes);  // 64-byte aligned; throws nk::Error when out of memory
  void deallocate(void* p, size_t bytes);

  size_t live_bytes() const { return live_.load(); }
  size_t peak_bytes() const { return peak_.load(); }
  void reset_peak() { peak_.store(live_.load()); }

 private:
  std::atomic<size_t> live_{0}, peak_{0};
};

}  // namespace nk
