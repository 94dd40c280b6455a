// Device memory with byte accounting. Every tensor's storage comes from here, so
// `live_bytes()` and `peak_bytes()` are the true footprint of Nekton's tensors.
#pragma once
#include <atomic>
#include <cstddef>
#include <string>

namespace nk {

// Where a tensor's storage lives. Only ops/ (which picks a kernel) and the
// allocator look at which one it is; the rest of the code passes a Device
// along from the config (`train.device`) or asks `kHost` for host memory.
enum class Device : uint8_t { CPU, CUDA };
const char* device_name(Device d);  // "cpu", "cuda"

// Host memory: what files are read into, what host pointers and data loaders
// fill, and what a host-side sampler reads. On a CPU run it is also the
// compute device, so host staging costs no copy there.
constexpr Device kHost = Device::CPU;

// The device named `name` ("cpu", "cuda") for config key `key`: nk::Error
// naming the key for an unknown name or a device this build or machine lacks.
Device parse_device(const std::string& name, const std::string& key);
// Whether this build can allocate on `d` (CPU always; CUDA once its backend lands).
bool device_available(Device d);

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
