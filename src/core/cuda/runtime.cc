#include "core/cuda/runtime.h"

#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "core/error.h"

namespace nk::cuda {
namespace {

// The first of these set names this process's rank on its node.
int local_rank() {
  for (const char* v : {"NK_CUDA_DEVICE", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                        "LOCAL_RANK", "MPI_LOCALRANKID"}) {
    if (const char* s = std::getenv(v)) return std::atoi(s);
  }
  return 0;
}

struct DeviceState {
  int id = -1;
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
};

DeviceState& state() {
  static DeviceState st;
  static std::once_flag once;
  std::call_once(once, [] {
    const int n = device_count();
    if (n == 0) fail("CUDA: no GPU is visible to this process (cudaGetDeviceCount found none)");
    const int want = local_rank();
    if (const char* s = std::getenv("NK_CUDA_DEVICE"); s && (want < 0 || want >= n))
      fail("NK_CUDA_DEVICE={}: this process sees {} GPU(s) (0..{})", s, n, n - 1);
    st.id = want % n;
    NK_CUDA_CHECK(cudaSetDevice(st.id));
    NK_CUDA_CHECK(cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking));
    NK_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&st.pool, st.id));
    // Keep freed blocks cached in the pool instead of returning them to the
    // driver at every synchronisation.
    uint64_t threshold = UINT64_MAX;
    NK_CUDA_CHECK(cudaMemPoolSetAttribute(st.pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  });
  return st;
}

uint64_t pool_attr(cudaMemPoolAttr a) {
  uint64_t v = 0;
  NK_CUDA_CHECK(cudaMemPoolGetAttribute(state().pool, a, &v));
  return v;
}

}  // namespace

void check(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  fail("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err), call,
       file, line);
}

void check_launch(const char* kernel, const char* file, int line) {
  check(cudaGetLastError(), kernel, file, line);
  static const bool sync = [] {
    const char* s = std::getenv("NK_CUDA_SYNC");
    return s && std::string(s) == "1";
  }();
  if (sync) check(cudaStreamSynchronize(stream()), kernel, file, line);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

int device() {
  return state().id;
}

std::string device_description() {
  cudaDeviceProp p{};
  NK_CUDA_CHECK(cudaGetDeviceProperties(&p, device()));
  return fmt::format("cuda:{} {} (sm_{}{}, {} SMs, {:.1f} GiB)", device(), p.name, p.major, p.minor,
                     p.multiProcessorCount, double(p.totalGlobalMem) / (1 << 30));
}

cudaStream_t stream() {
  return state().stream;
}

void synchronize() {
  NK_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void* allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  cudaError_t err = cudaMallocAsync(&p, bytes, stream());
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    release_cached();
    err = cudaMallocAsync(&p, bytes, stream());
  }
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    fail(
        "CUDA out of memory on {}: allocating {} bytes with {} bytes reserved by Nekton's pool "
        "({} in use), {} of {} bytes free on the device",
        device_description(), bytes, reserved_bytes(), pool_attr(cudaMemPoolAttrUsedMemCurrent),
        free, total);
  }
  check(err, "cudaMallocAsync", __FILE__, __LINE__);
  return p;
}

void deallocate(void* p) {
  if (p) NK_CUDA_CHECK(cudaFreeAsync(p, stream()));
}

size_t reserved_bytes() {
  return pool_attr(cudaMemPoolAttrReservedMemCurrent);
}

void release_cached() {
  synchronize();
  NK_CUDA_CHECK(cudaMemPoolTrimTo(state().pool, 0));
}

void copy_from_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  // From pageable memory the copy is staged before the call returns, so the
  // caller may reuse src at once.
  NK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  NK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
  synchronize();
}

void copy_on_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  NK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}

void memset_zero(void* dst, size_t bytes) {
  if (bytes) NK_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream()));
}

Stream::Stream() {
  device();
  NK_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
}
Stream::~Stream() {
  if (s_) cudaStreamDestroy(s_);
}
void Stream::synchronize() {
  NK_CUDA_CHECK(cudaStreamSynchronize(s_));
}
void Stream::wait(cudaEvent_t e) {
  NK_CUDA_CHECK(cudaStreamWaitEvent(s_, e, 0));
}

Event::Event(bool timing) {
  device();
  NK_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
Event::~Event() {
  if (e_) cudaEventDestroy(e_);
}
void Event::record(cudaStream_t s) {
  NK_CUDA_CHECK(cudaEventRecord(e_, s));
}
void Event::synchronize() {
  NK_CUDA_CHECK(cudaEventSynchronize(e_));
}
float Event::elapsed_ms(const Event& start) const {
  float ms = 0;
  NK_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

}  // namespace nk::cuda
