// Helpers shared by the CUDA kernels of ops/cuda: dtype dispatch, fp32 <->
// storage-type loads and stores bit-identical to the CPU's (ops/cpu/float_io.h),
// launch shapes and block-wide reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <utility>

#include "core/cuda/runtime.h"
#include "core/tensor.h"

namespace nk::ops::cuda {

// Calls fn(T{}) with T the storage type of `dt` (float, bf16, f16: the host
// structs, whose 16 bits the device loads and stores below read and write).
template <typename Fn>
void dispatch_float(DType dt, const char* op, Fn&& fn) {
  switch (dt) {
    case DType::F32:
      fn(float{});
      break;
    case DType::BF16:
      fn(bf16{});
      break;
    case DType::F16:
      fn(f16{});
      break;
    default:
      NK_CHECK(false, "{}: unsupported dtype {}", op, dtype_name(dt));
  }
}

__device__ __forceinline__ float load(float v) {
  return v;
}
__device__ __forceinline__ float load(bf16 v) {
  return __uint_as_float(uint32_t(v.bits) << 16);
}
__device__ __forceinline__ float load(f16 v) {
  return __half2float(__ushort_as_half(v.bits));
}

template <typename T>
__device__ __forceinline__ T store(float v);
template <>
__device__ __forceinline__ float store<float>(float v) {
  return v;
}
// Round to nearest even, NaN kept quiet: the CPU's f32_to_bf16 bit for bit.
template <>
__device__ __forceinline__ bf16 store<bf16>(float v) {
  const uint32_t u = __float_as_uint(v);
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return bf16{uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : r)};
}
template <>
__device__ __forceinline__ f16 store<f16>(float v) {
  return f16{__half_as_ushort(__float2half_rn(v))};
}

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements (at most a few waves).
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : b > 65535 * 4 ? 65535 * 4 : b);
}

// for (i = global thread; i < n; i += grid size)
#define NK_GRID_STRIDE(i, n)                                                \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// Sum (or max) of v over the block; every thread gets the result. `shared`
// holds 32 floats; blockDim.x a multiple of 32 up to 1024.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

// A device-side error flag for kernels that validate what they read (token
// ids, targets, positions): kernels atomically record the first bad index and
// value; `check` copies it back (a synchronisation) and throws nk::Error with
// `what` formatted from them. For ops whose inputs come from the host anyway
// this costs one small copy per call.
struct DeviceError {
  int64_t* flag;  // [0] = bad flat index + 1 (0: none), [1] = the value read
};
__device__ __forceinline__ void report(DeviceError e, int64_t index, int64_t value) {
  if (atomicCAS(reinterpret_cast<unsigned long long*>(e.flag), 0ull,
                static_cast<unsigned long long>(index + 1)) == 0ull)
    e.flag[1] = value;
}

class ErrorFlag {
 public:
  ErrorFlag();
  ~ErrorFlag();
  ErrorFlag(const ErrorFlag&) = delete;
  ErrorFlag& operator=(const ErrorFlag&) = delete;
  DeviceError device() const { return {flag_}; }
  // {-1, 0} when no kernel reported, else {index, value} of the first report.
  std::pair<int64_t, int64_t> read() const;

 private:
  int64_t* flag_ = nullptr;
};

}  // namespace nk::ops::cuda
