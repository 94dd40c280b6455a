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
// Whether this process can allocate on `d`: the CPU always; CUDA in a build
// with the CUDA backend (NK_WITH_CUDA) on a machine with a visible GPU.
bool device_available(Device d);
// Why `d` is not available ("" when it is), for error messages.
std::string why_unavailable(Device d);

// Host memory is 64-byte aligned from the C library; CUDA memory comes from
// the device's stream-ordered caching pool (core/cuda/runtime.h), so a block
// freed by one op is reused by the next without a device synchronisation.
// live and peak count the bytes tensors hold; the CUDA pool's reserved bytes
// (held from the driver, cached ones included) are cuda::reserved_bytes().
class Allocator {
 public:
  // The allocator for `d`; throws nk::Error for a device this process lacks.
  static Allocator& get(Device d);

  void* allocate(size_t bytes);  // throws nk::Error when out of memory
  void deallocate(void* p, size_t bytes);

  size_t live_bytes() const { return live_.load(); }
  size_t peak_bytes() const { return peak_.load(); }
  void reset_peak() { peak_.store(live_.load()); }

 private:
  explicit Allocator(Device d) : device_(d) {}
  Device device_;
  std::atomic<size_t> live_{0}, peak_{0};
};

}  // namespace nk
