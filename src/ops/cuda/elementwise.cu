// Copies, conversions, elementwise arithmetic and whole-tensor reductions on
// CUDA (arguments checked by ops/elementwise.cc; CPU twins in
// ops/cpu/elementwise.cc and ops/cpu/host_int.cc). Elementwise kernels are
// grid-stride loops in fp32; add, accumulate and scale move VEC elements per
// thread and step (16-byte accesses) when every pointer is aligned for them,
// the n % VEC left over one per thread; reductions that return a value to the host sum
// per-block partials over a grid that depends only on the element count, then
// the partials in block order in one block: the same result on every run.
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/dropout_mask.h"

namespace nk::ops::cuda {
namespace {

cudaStream_t stream() {
  return nk::cuda::stream();
}

// ---- elementwise kernels ----

// dst D[n] <- src S[n]
template <typename D, typename S>
__global__ void convert_kernel(D* dst, const S* src, int64_t n) {
  NK_GRID_STRIDE(i, n) dst[i] = store<D>(load(src[i]));
}

// dst T[n] <- value
template <typename T>
__global__ void fill_kernel(T* dst, float value, int64_t n) {
  const T v = store<T>(value);
  NK_GRID_STRIDE(i, n) dst[i] = v;
}

// The elements [n - n % VEC, n) left over by a loop over whole vectors: one
// per thread of the grid's first ones; calls fn(i) for this thread's, if any.
template <int VEC, typename Fn>
__device__ __forceinline__ void vec_tail(int64_t n, Fn&& fn) {
  const int64_t i = n / VEC * VEC + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (VEC > 1 && i < n) fn(i);
}

// Blocks for a grid-stride loop over the n / VEC vectors of n elements (at least one block, for
// the tail).
template <int VEC>
unsigned vec_blocks(int64_t n) {
  return blocks_for(std::max<int64_t>(n / VEC, 1));
}

// dst D[n] += src S[n]; VEC elements per thread and step (the dst may be src: each
// element is read before it is written, by the same thread)
template <typename D, typename S, int VEC>
__global__ void accumulate_kernel(D* dst, const S* src, int64_t n) {
  NK_GRID_STRIDE(i, n / VEC) {
    float d[VEC], s[VEC];
    load_vec<D, VEC>(d, dst + i * VEC);
    load_vec<S, VEC>(s, src + i * VEC);
#pragma unroll
    for (int e = 0; e < VEC; ++e) d[e] += s[e];
    store_vec<D, VEC>(dst + i * VEC, d);
  }
  vec_tail<VEC>(n, [&](int64_t i) { dst[i] = store<D>(load(dst[i]) + load(src[i])); });
}

// y T[n] <- a T[n] + b T[n] (y may alias a or b); VEC elements per thread and step
template <typename T, int VEC>
__global__ void add_kernel(T* y, const T* a, const T* b, int64_t n) {
  NK_GRID_STRIDE(i, n / VEC) {
    float va[VEC], vb[VEC];
    load_vec<T, VEC>(va, a + i * VEC);
    load_vec<T, VEC>(vb, b + i * VEC);
#pragma unroll
    for (int e = 0; e < VEC; ++e) va[e] += vb[e];
    store_vec<T, VEC>(y + i * VEC, va);
  }
  vec_tail<VEC>(n, [&](int64_t i) { y[i] = store<T>(load(a[i]) + load(b[i])); });
}

// x T[n] *= s; VEC elements per thread and step
template <typename T, int VEC>
__global__ void scale_kernel(T* x, float s, int64_t n) {
  NK_GRID_STRIDE(i, n / VEC) {
    float v[VEC];
    load_vec<T, VEC>(v, x + i * VEC);
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] *= s;
    store_vec<T, VEC>(x + i * VEC, v);
  }
  vec_tail<VEC>(n, [&](int64_t i) { x[i] = store<T>(load(x[i]) * s); });
}

// y T[N, M] columns [col0, col0 + m) += s * z T[N, m]
template <typename T>
__global__ void add_columns_kernel(T* y, const T* z, int64_t N, int64_t M, int64_t m, int64_t col0,
                                   float s) {
  NK_GRID_STRIDE(i, N * m) {
    const int64_t n = i / m, j = i % m;
    T& d = y[n * M + col0 + j];
    d = store<T>(load(d) + s * load(z[i]));
  }
}

// z T[N, m] <- s * y T[N, M] columns [col0, col0 + m)
template <typename T>
__global__ void copy_columns_kernel(T* z, const T* y, int64_t N, int64_t M, int64_t m, int64_t col0,
                                    float s) {
  NK_GRID_STRIDE(i, N * m) {
    const int64_t n = i / m, j = i % m;
    z[i] = store<T>(s * load(y[n * M + col0 + j]));
  }
}

// y T[N, M] columns [col0, col0 + m) *= l T[m]
template <typename T>
__global__ void scale_columns_kernel(T* y, const T* l, int64_t N, int64_t M, int64_t m,
                                     int64_t col0) {
  NK_GRID_STRIDE(i, N * m) {
    const int64_t n = i / m, j = i % m;
    T& d = y[n * M + col0 + j];
    d = store<T>(load(d) * load(l[j]));
  }
}

// y T[N, M] rows *= s f32[N]
template <typename T>
__global__ void scale_rows_kernel(T* y, const float* s, int64_t N, int64_t M) {
  NK_GRID_STRIDE(i, N * M) {
    T& d = y[i];
    d = store<T>(load(d) * s[i / M]);
  }
}

// y T[n] <- x T[n] * keep(seed, i) / (1 - p) (y may alias x)
template <typename T>
__global__ void dropout_kernel(T* y, const T* x, int64_t n, float p, float keep_scale,
                               uint64_t seed) {
  NK_GRID_STRIDE(i, n) {
    y[i] = dropout_keeps(seed, i, p) ? store<T>(load(x[i]) * keep_scale) : store<T>(0.f);
  }
}

// dl f32[m] += sum_n a T[N, M][n, col0 + j] * b T[N, m][n, j]. A block covers kDotCols
// columns; its kDotGroups rows of threads sum every kDotGroups-th row in double,
// then one thread per column adds the groups' sums in group order.
constexpr int kDotCols = 32, kDotGroups = 16;
template <typename T>
__global__ void column_dot_kernel(float* dl, const T* a, const T* b, int64_t N, int64_t M,
                                  int64_t m, int64_t col0) {
  __shared__ double part[kDotGroups][kDotCols];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = int64_t(blockIdx.x) * kDotCols + tx;
  double sum = 0;
  if (j < m)
    for (int64_t n = ty; n < N; n += kDotGroups)
      sum += double(load(a[n * M + col0 + j])) * double(load(b[n * m + j]));
  part[ty][tx] = sum;
  __syncthreads();
  if (ty == 0 && j < m) {
    double total = 0;
    for (int g = 0; g < kDotGroups; ++g) total += part[g][tx];
    dl[j] += float(total);
  }
}

// ---- deterministic sums returned to the host ----

// Sum of v over the block (double or long long); every thread gets it. `shared`
// holds 32 values; blockDim.x a multiple of 32. Called once per kernel.
template <typename Acc>
__device__ __forceinline__ Acc block_total(Acc v, Acc* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : Acc(0);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// partial Acc[gridDim.x] <- per block, the sum of term(i) over its grid-stride share of [0, n)
template <typename Acc, typename Term>
__global__ void partial_sums_kernel(Acc* partial, int64_t n, Term term) {
  __shared__ Acc shared[32];
  Acc sum = 0;
  NK_GRID_STRIDE(i, n) sum += term(i);
  sum = block_total(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// out Acc[1] <- sum of partial Acc[parts] (one block, parts <= blockDim.x)
template <typename Acc>
__global__ void final_sum_kernel(Acc* out, const Acc* partial, int parts) {
  __shared__ Acc shared[32];
  Acc v = int(threadIdx.x) < parts ? partial[threadIdx.x] : Acc(0);
  v = block_total(v, shared);
  if (threadIdx.x == 0) out[0] = v;
}

constexpr int kMaxParts = 1024;  // blocks of the partial sums, and threads of the final one

// Sum of term(i) for i < n, computed on the device and copied back (a wait).
template <typename Acc, typename Term>
Acc device_sum(int64_t n, Term term, DType acc_dtype, const char* name) {
  const unsigned blocks = std::min<unsigned>(blocks_for(n), kMaxParts);
  Tensor buf = Tensor::empty({int64_t(blocks) + 1}, acc_dtype, Device::CUDA);
  Acc* partial = static_cast<Acc*>(buf.raw());
  partial_sums_kernel<Acc, Term><<<blocks, kThreads, 0, stream()>>>(partial, n, term);
  NK_CUDA_LAUNCHED(name);
  final_sum_kernel<Acc><<<1, kMaxParts, 0, stream()>>>(partial + blocks, partial, int(blocks));
  NK_CUDA_LAUNCHED(name);
  Acc result{};
  nk::cuda::copy_to_host(&result, partial + blocks, sizeof(Acc));
  return result;
}

// x[i]^2 in double (exact for f32, bf16 and f16 values)
template <typename T>
struct SquareOf {
  const T* p;
  __device__ double operator()(int64_t i) const {
    const double v = load(p[i]);
    return v * v;
  }
};

// 1 when x[i] is NaN or +-Inf (exponent all ones)
template <typename T>
struct NonfiniteOf {
  const T* p;
  __device__ long long operator()(int64_t i) const {
    return (__float_as_uint(load(p[i])) & 0x7f800000u) == 0x7f800000u ? 1 : 0;
  }
};

// 1 when x[i] != value
struct NotEqualTo {
  const int32_t* p;
  int64_t value;
  __device__ long long operator()(int64_t i) const { return int64_t(p[i]) != value ? 1 : 0; }
};

}  // namespace

void convert(Tensor dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (dst.dtype() == src.dtype()) {
    if (dst.raw() != src.raw()) nk::cuda::copy_on_device(dst.raw(), src.raw(), dst.nbytes());
    return;
  }
  dispatch_float(dst.dtype(), "convert", [&](auto dt) {
    using D = decltype(dt);
    dispatch_float(src.dtype(), "convert", [&](auto st) {
      using S = decltype(st);
      convert_kernel<D, S>
          <<<blocks_for(n), kThreads, 0, stream()>>>(dst.data<D>(), src.data<S>(), n);
      NK_CUDA_LAUNCHED("convert_kernel");
    });
  });
}

void fill(Tensor dst, float value) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  dispatch_float(dst.dtype(), "fill", [&](auto tag) {
    using T = decltype(tag);
    fill_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(dst.data<T>(), value, n);
    NK_CUDA_LAUNCHED("fill_kernel");
  });
}

// Converted to f32 on the device, then one copy (which waits).
void copy_to_host(const Tensor& src, float* dst) {
  if (src.numel() == 0) return;
  if (src.dtype() == DType::F32) {
    nk::cuda::copy_to_host(dst, src.raw(), src.nbytes());
    return;
  }
  dispatch_float(src.dtype(), "copy_to_host", [](auto) {});  // a float dtype
  Tensor tmp = Tensor::empty(src.shape(), DType::F32, Device::CUDA);
  convert(tmp, src);
  nk::cuda::copy_to_host(dst, tmp.raw(), tmp.nbytes());
}

// One copy into an f32 device buffer, then converted on the device.
void copy_from_host(Tensor dst, const float* src) {
  if (dst.numel() == 0) return;
  if (dst.dtype() == DType::F32) {
    nk::cuda::copy_from_host(dst.raw(), src, dst.nbytes());
    return;
  }
  dispatch_float(dst.dtype(), "copy_from_host", [](auto) {});  // a float dtype
  Tensor tmp = Tensor::empty(dst.shape(), DType::F32, Device::CUDA);
  nk::cuda::copy_from_host(tmp.raw(), src, tmp.nbytes());
  convert(dst, tmp);
}

// dst and src may differ in dtype (e.g. bf16 grads into an f32 arena).
void accumulate(Tensor dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  dispatch_float(dst.dtype(), "accumulate", [&](auto dt) {
    using D = decltype(dt);
    dispatch_float(src.dtype(), "accumulate", [&](auto st) {
      using S = decltype(st);
      // 16 bytes of the wider type per access: 4 when either is f32, else 8
      constexpr int V = kVec<D> < kVec<S> ? kVec<D> : kVec<S>;
      if (vec_aligned<D, V>(dst.raw()) && vec_aligned<S, V>(src.raw()))
        accumulate_kernel<D, S, V>
            <<<vec_blocks<V>(n), kThreads, 0, stream()>>>(dst.data<D>(), src.data<S>(), n);
      else
        accumulate_kernel<D, S, 1>
            <<<blocks_for(n), kThreads, 0, stream()>>>(dst.data<D>(), src.data<S>(), n);
      NK_CUDA_LAUNCHED("accumulate_kernel");
    });
  });
}

void add(Tensor y, const Tensor& a, const Tensor& b) {
  const int64_t n = y.numel();
  if (n == 0) return;
  dispatch_float(y.dtype(), "add", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec<T>;
    if (vec_aligned<T, V>(y.raw()) && vec_aligned<T, V>(a.raw()) && vec_aligned<T, V>(b.raw()))
      add_kernel<T, V>
          <<<vec_blocks<V>(n), kThreads, 0, stream()>>>(y.data<T>(), a.data<T>(), b.data<T>(), n);
    else
      add_kernel<T, 1>
          <<<blocks_for(n), kThreads, 0, stream()>>>(y.data<T>(), a.data<T>(), b.data<T>(), n);
    NK_CUDA_LAUNCHED("add_kernel");
  });
}

double sum_squares(const Tensor& x) {
  double total = 0;
  dispatch_float(x.dtype(), "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    total = device_sum<double>(x.numel(), SquareOf<T>{x.data<T>()}, DType::F64,
                               "sum_squares partial_sums_kernel");
  });
  return total;
}

void scale(Tensor x, float s) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x.dtype(), "scale", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec<T>;
    if (vec_aligned<T, V>(x.raw()))
      scale_kernel<T, V><<<vec_blocks<V>(n), kThreads, 0, stream()>>>(x.data<T>(), s, n);
    else
      scale_kernel<T, 1><<<blocks_for(n), kThreads, 0, stream()>>>(x.data<T>(), s, n);
    NK_CUDA_LAUNCHED("scale_kernel");
  });
}

int64_t count_nonfinite(const Tensor& x) {
  long long total = 0;
  dispatch_float(x.dtype(), "count_nonfinite", [&](auto tag) {
    using T = decltype(tag);
    total = device_sum<long long>(x.numel(), NonfiniteOf<T>{x.data<T>()}, DType::I64,
                                  "count_nonfinite partial_sums_kernel");
  });
  return int64_t(total);
}

void add_columns(Tensor y, const Tensor& z, int64_t col0, float s) {
  const int64_t N = y.dim(0), M = y.dim(1), m = z.dim(1);
  if (N * m == 0) return;
  dispatch_float(y.dtype(), "add_columns", [&](auto tag) {
    using T = decltype(tag);
    add_columns_kernel<T>
        <<<blocks_for(N * m), kThreads, 0, stream()>>>(y.data<T>(), z.data<T>(), N, M, m, col0, s);
    NK_CUDA_LAUNCHED("add_columns_kernel");
  });
}

void copy_columns(Tensor z, const Tensor& y, int64_t col0, float s) {
  const int64_t N = y.dim(0), M = y.dim(1), m = z.dim(1);
  if (N * m == 0) return;
  dispatch_float(y.dtype(), "copy_columns", [&](auto tag) {
    using T = decltype(tag);
    copy_columns_kernel<T>
        <<<blocks_for(N * m), kThreads, 0, stream()>>>(z.data<T>(), y.data<T>(), N, M, m, col0, s);
    NK_CUDA_LAUNCHED("copy_columns_kernel");
  });
}

void dropout(Tensor y, const Tensor& x, float p, uint64_t seed) {
  const int64_t n = y.numel();
  if (n == 0) return;
  const float keep_scale = 1.f / (1.f - p);
  dispatch_float(y.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    dropout_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(y.data<T>(), x.data<T>(), n, p,
                                                                keep_scale, seed);
    NK_CUDA_LAUNCHED("dropout_kernel");
  });
}

void scale_columns(Tensor y, const Tensor& l, int64_t col0) {
  const int64_t N = y.dim(0), M = y.dim(1), m = l.dim(0);
  if (N * m == 0) return;
  dispatch_float(y.dtype(), "scale_columns", [&](auto tag) {
    using T = decltype(tag);
    scale_columns_kernel<T>
        <<<blocks_for(N * m), kThreads, 0, stream()>>>(y.data<T>(), l.data<T>(), N, M, m, col0);
    NK_CUDA_LAUNCHED("scale_columns_kernel");
  });
}

void scale_rows(Tensor y, const Tensor& s) {
  const int64_t N = y.dim(0), M = y.dim(1);
  if (N * M == 0) return;
  dispatch_float(y.dtype(), "scale_rows", [&](auto tag) {
    using T = decltype(tag);
    scale_rows_kernel<T>
        <<<blocks_for(N * M), kThreads, 0, stream()>>>(y.data<T>(), s.data<float>(), N, M);
    NK_CUDA_LAUNCHED("scale_rows_kernel");
  });
}

// Columns in parallel, each summed in a fixed order: the same sums on every run.
void column_dot(Tensor dl, const Tensor& a, int64_t col0, const Tensor& b) {
  const int64_t N = a.dim(0), M = a.dim(1), m = b.dim(1);
  if (m == 0) return;
  const unsigned blocks = unsigned((m + kDotCols - 1) / kDotCols);
  dispatch_float(a.dtype(), "column_dot", [&](auto tag) {
    using T = decltype(tag);
    column_dot_kernel<T><<<blocks, dim3(kDotCols, kDotGroups), 0, stream()>>>(
        dl.data<float>(), a.data<T>(), b.data<T>(), N, M, m, col0);
    NK_CUDA_LAUNCHED("column_dot_kernel");
  });
}

void copy_bytes_from_host(Tensor dst, const void* src) {
  if (dst.nbytes() > 0) nk::cuda::copy_from_host(dst.raw(), src, dst.nbytes());
}

void copy_bytes_to_host(const Tensor& src, void* dst) {
  if (src.nbytes() > 0) nk::cuda::copy_to_host(dst, src.raw(), src.nbytes());
}

int64_t count_not_equal(const Tensor& x, int64_t value) {
  return int64_t(device_sum<long long>(x.numel(), NotEqualTo{x.data<int32_t>(), value}, DType::I64,
                                       "count_not_equal partial_sums_kernel"));
}

void synchronize() {
  nk::cuda::synchronize();
}

}  // namespace nk::ops::cuda
