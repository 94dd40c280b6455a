// The CUDA runtime behind Device::CUDA: checked calls, the compute stream,
// streams and events, host<->device copies and the device memory the
// allocator hands out. Compiled only with NK_WITH_CUDA (src/core/cuda);
// the rest of Nekton reaches it through core/allocator.h and ops/.
//
// One compute stream per process (`stream()`): every kernel, copy and
// stream-ordered allocation goes there, so work is ordered without host
// synchronisation, and memory freed by one op is reused by the next without
// waiting. Code that uses another stream records an Event on it and makes the
// compute stream wait (Stream::wait) before its results are read.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace nk::cuda {

// Throws nk::Error naming the call, the file and line and CUDA's message
// when `err` is not cudaSuccess.
void check(cudaError_t err, const char* call, const char* file, int line);
#define NK_CUDA_CHECK(call) ::nk::cuda::check((call), #call, __FILE__, __LINE__)
// After a kernel launch: the launch's own error (bad configuration, no kernel
// image for this GPU). With NK_CUDA_SYNC=1 in the environment it also waits
// for the kernel, so an illegal access is reported at the op that did it.
void check_launch(const char* kernel, const char* file, int line);
#define NK_CUDA_LAUNCHED(kernel) ::nk::cuda::check_launch((kernel), __FILE__, __LINE__)

// GPUs this process can use (0 when there is no driver or no device; never throws).
int device_count();
// The device of this process (0 unless NK_CUDA_DEVICE or a launcher's local
// rank says otherwise), made current on first use; its name and compute
// capability for logs.
int device();
std::string device_description();

// The compute stream of the current device.
cudaStream_t stream();
// Waits for all work on the compute stream.
void synchronize();

// Stream-ordered device memory from the device's pool (cudaMallocAsync with
// an unbounded release threshold: freed blocks stay cached for reuse in
// stream order). allocate throws nk::Error naming the size and the pool's
// state when the device is out of memory, after returning cached blocks to
// the driver once and retrying.
void* allocate(size_t bytes);
void deallocate(void* p);
// Bytes the pool holds from the driver (in use plus cached).
size_t reserved_bytes();
// Returns the pool's unused cached memory to the driver.
void release_cached();

// Copies on the compute stream. to_host waits for the copy (and everything
// before it on the stream); from_host returns once the source may be reused.
void copy_from_host(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);
void memset_zero(void* dst, size_t bytes);

// An owned stream (non-blocking with respect to the legacy default stream).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize();
  // Work queued on this stream after the call waits for `e`.
  void wait(cudaEvent_t e);

 private:
  cudaStream_t s_ = nullptr;
};

// An owned event; timing ones measure the time between two records.
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s);
  void synchronize();
  // Milliseconds from `start` to this event (both recorded, timing).
  float elapsed_ms(const Event& start) const;

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace nk::cuda
