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
#include "ops/dtype_dispatch.h"

namespace nk::ops::cuda {

// dispatch_float (ops/dtype_dispatch.h) hands kernels the host structs bf16
// and f16, whose 16 bits the device loads and stores below read and write.
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

// ---- vectors: up to 16 bytes per load or store ----

// Elements of T in 16 bytes: 4 f32, 8 bf16 or f16.
template <typename T>
constexpr int kVec = int(16 / sizeof(T));

// VEC consecutive elements of T moved as one access of sizeof(T) * VEC bytes
// (at most 16): the address must be aligned to that size (vec_aligned).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T e[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_pack(const T* p) {
  static_assert(sizeof(T) * VEC <= 16, "a pack is at most 16 bytes");
  return *reinterpret_cast<const Pack<T, VEC>*>(p);
}
template <typename T, int VEC>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, VEC>& v) {
  static_assert(sizeof(T) * VEC <= 16, "a pack is at most 16 bytes");
  *reinterpret_cast<Pack<T, VEC>*>(p) = v;
}

// Elements per access when moving VEC of them: VEC, or 16 bytes' worth when
// VEC of T are more (8 f32 go as two 16-byte accesses).
template <typename T, int VEC>
constexpr int kPiece = VEC < kVec<T> ? VEC : kVec<T>;

// f [VEC] <- the VEC elements of T at p as floats (load's rounding), and back
// (store's); p aligned as vec_aligned<T, VEC> says.
template <typename T, int VEC>
__device__ __forceinline__ void load_vec(float (&f)[VEC], const T* p) {
  constexpr int P = kPiece<T, VEC>;
  static_assert(VEC % P == 0, "VEC is a power of two");
#pragma unroll
  for (int h = 0; h < VEC; h += P) {
    const Pack<T, P> v = load_pack<T, P>(p + h);
#pragma unroll
    for (int i = 0; i < P; ++i) f[h + i] = load(v.e[i]);
  }
}
template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T* p, const float (&f)[VEC]) {
  constexpr int P = kPiece<T, VEC>;
  static_assert(VEC % P == 0, "VEC is a power of two");
#pragma unroll
  for (int h = 0; h < VEC; h += P) {
    Pack<T, P> v;
#pragma unroll
    for (int i = 0; i < P; ++i) v.e[i] = store<T>(f[h + i]);
    store_pack<T, P>(p + h, v);
  }
}

// Whether p may be read or written VEC elements of T at a time by load_vec,
// store_vec (and load_pack, store_pack when sizeof(T) * VEC <= 16): aligned
// to the size of one access. A null pointer is.
template <typename T, int VEC>
inline bool vec_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * kPiece<T, VEC>) == 0;
}

// Multiprocessors of this process's device (nk::cuda::device()), read once.
inline int sm_count() {
  static const int n = [] {
    int c = 0;
    NK_CUDA_CHECK(cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, nk::cuda::device()));
    return c > 0 ? c : 1;
  }();
  return n;
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
