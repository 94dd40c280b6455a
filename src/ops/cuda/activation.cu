// GELU (tanh form), SiLU, ReLU and SwiGLU on CUDA (arguments checked by
// ops/activation.cc; CPU twins in ops/cpu/activation.cc, whose formulas these
// are): grid-stride loops over 16-byte vectors (8 bf16 or 4 f32 per thread
// and step) when every pointer is 16-byte aligned (and, for SwiGLU, F a
// multiple of the vector), else over single elements; the last n % 8 (or 4)
// elements one per thread. fp32 arithmetic; the sigmoid from the hardware's
// exp (__expf: a few ulp, plus ~1e-7 |x| relative) and a correctly rounded
// reciprocal. The tanh form is rewritten as the CPU has it: 0.5 (1 + tanh u) =
// sigmoid(2u), which has no cancellation. Each element is read before it is
// written, by the thread that writes it, so the outputs may alias the inputs
// where ops.h allows it.
#include <algorithm>
#include <initializer_list>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/shapes.h"

namespace nk::ops::cuda {
namespace {

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

// 1 / (1 + e^-v): 0 for v below about -88 (e^-v is +inf), 1 above about 17.
__device__ __forceinline__ float sigmoid(float v) {
  return __frcp_rn(1.f + __expf(-v));
}

// Each activation: f and its derivative f'.
struct Gelu {
  static __device__ __forceinline__ float f(float v) {
    const float u = kGeluK * (v + kGeluC * v * v * v);
    return v * sigmoid(2.f * u);
  }
  // d/dx [x s(2u)] = s + x * 2 s (1 - s) u'.
  static __device__ __forceinline__ float grad(float v) {
    const float u = kGeluK * (v + kGeluC * v * v * v);
    const float du = kGeluK * (1.f + 3.f * kGeluC * v * v);
    const float s = sigmoid(2.f * u);
    return s + 2.f * v * s * (1.f - s) * du;
  }
};

struct Silu {
  static __device__ __forceinline__ float f(float v) { return v * sigmoid(v); }
  // d/dx [x s(x)] = s (1 + x (1 - s)).
  static __device__ __forceinline__ float grad(float v) {
    const float s = sigmoid(v);
    return s * (1.f + v * (1.f - s));
  }
};

struct Relu {
  static __device__ __forceinline__ float f(float v) { return v > 0.f ? v : 0.f; }
  static __device__ __forceinline__ float grad(float v) { return v > 0.f ? 1.f : 0.f; }
};

// y T[n] <- f(x T[n]): VEC elements per thread and step, then the n % VEC
// left over one per thread.
template <typename T, typename Act, int VEC>
__global__ void unary_forward_kernel(T* y, const T* x, int64_t n) {
  const int64_t nv = n / VEC;
  NK_GRID_STRIDE(i, nv) {
    float v[VEC];
    load_vec<T, VEC>(v, x + i * VEC);
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = Act::f(v[e]);
    store_vec<T, VEC>(y + i * VEC, v);
  }
  const int64_t t = nv * VEC + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < n) y[t] = store<T>(Act::f(load(x[t])));
}

// dx T[n] <- dy T[n] * f'(x T[n]), as unary_forward_kernel
template <typename T, typename Act, int VEC>
__global__ void unary_backward_kernel(T* dx, const T* dy, const T* x, int64_t n) {
  const int64_t nv = n / VEC;
  NK_GRID_STRIDE(i, nv) {
    float d[VEC], v[VEC];
    load_vec<T, VEC>(d, dy + i * VEC);
    load_vec<T, VEC>(v, x + i * VEC);
#pragma unroll
    for (int e = 0; e < VEC; ++e) d[e] *= Act::grad(v[e]);
    store_vec<T, VEC>(dx + i * VEC, d);
  }
  const int64_t t = nv * VEC + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < n) dx[t] = store<T>(load(dy[t]) * Act::grad(load(x[t])));
}

// y T[N, F] <- silu(gu T[N, 2F][:, :F]) * gu[:, F:]; F a multiple of VEC, each
// thread and step VEC consecutive columns of one row
template <typename T, int VEC>
__global__ void swiglu_forward_kernel(T* y, const T* gu, int64_t N, int64_t F) {
  const int64_t fv = F / VEC;
  NK_GRID_STRIDE(i, N * fv) {
    const int64_t n = i / fv, f = (i - n * fv) * VEC;
    const T* g = gu + n * 2 * F + f;
    float gv[VEC], uv[VEC];
    load_vec<T, VEC>(gv, g);
    load_vec<T, VEC>(uv, g + F);
#pragma unroll
    for (int e = 0; e < VEC; ++e) gv[e] = gv[e] * sigmoid(gv[e]) * uv[e];
    store_vec<T, VEC>(y + n * F + f, gv);
  }
}

// dgu T[N, 2F] <- [dy * u * silu'(g) | dy * silu(g)] from dy T[N, F], gu T[N, 2F] = [g | u];
// F a multiple of VEC, as swiglu_forward_kernel
template <typename T, int VEC>
__global__ void swiglu_backward_kernel(T* dgu, const T* dy, const T* gu, int64_t N, int64_t F) {
  const int64_t fv = F / VEC;
  NK_GRID_STRIDE(i, N * fv) {
    const int64_t n = i / fv, f = (i - n * fv) * VEC;
    const T* g = gu + n * 2 * F + f;
    float gv[VEC], uv[VEC], dv[VEC], dg[VEC], du[VEC];
    load_vec<T, VEC>(gv, g);
    load_vec<T, VEC>(uv, g + F);
    load_vec<T, VEC>(dv, dy + n * F + f);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const float s = sigmoid(gv[e]);
      dg[e] = dv[e] * uv[e] * s * (1.f + gv[e] * (1.f - s));
      du[e] = dv[e] * gv[e] * s;
    }
    T* d = dgu + n * 2 * F + f;
    store_vec<T, VEC>(d, dg);
    store_vec<T, VEC>(d + F, du);
  }
}

// Whether every pointer may be accessed kVec<T> elements at a time.
template <typename T>
bool all_vec_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (!vec_aligned<T, kVec<T>>(p)) return false;
  return true;
}

template <typename Act>
void unary_forward(Tensor& y, const Tensor& x, const char* op) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const cudaStream_t st = nk::cuda::stream();
    if (all_vec_aligned<T>({y.raw(), x.raw()})) {
      constexpr int V = kVec<T>;
      unary_forward_kernel<T, Act, V><<<blocks_for(std::max<int64_t>(n / V, 1)), kThreads, 0, st>>>(
          y.data<T>(), x.data<T>(), n);
    } else {
      unary_forward_kernel<T, Act, 1>
          <<<blocks_for(n), kThreads, 0, st>>>(y.data<T>(), x.data<T>(), n);
    }
    NK_CUDA_LAUNCHED(op);
  });
}

template <typename Act>
void unary_backward(Tensor& dx, const Tensor& dy, const Tensor& x, const char* op) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const cudaStream_t st = nk::cuda::stream();
    if (all_vec_aligned<T>({dx.raw(), dy.raw(), x.raw()})) {
      constexpr int V = kVec<T>;
      unary_backward_kernel<T, Act, V>
          <<<blocks_for(std::max<int64_t>(n / V, 1)), kThreads, 0, st>>>(dx.data<T>(), dy.data<T>(),
                                                                         x.data<T>(), n);
    } else {
      unary_backward_kernel<T, Act, 1>
          <<<blocks_for(n), kThreads, 0, st>>>(dx.data<T>(), dy.data<T>(), x.data<T>(), n);
    }
    NK_CUDA_LAUNCHED(op);
  });
}

}  // namespace

void gelu_forward(Tensor y, const Tensor& x) {
  unary_forward<Gelu>(y, x, "gelu_forward");
}
void gelu_backward(Tensor dx, const Tensor& dy, const Tensor& x) {
  unary_backward<Gelu>(dx, dy, x, "gelu_backward");
}
void silu_forward(Tensor y, const Tensor& x) {
  unary_forward<Silu>(y, x, "silu_forward");
}
void silu_backward(Tensor dx, const Tensor& dy, const Tensor& x) {
  unary_backward<Silu>(dx, dy, x, "silu_backward");
}
void relu_forward(Tensor y, const Tensor& x) {
  unary_forward<Relu>(y, x, "relu_forward");
}
void relu_backward(Tensor dx, const Tensor& dy, const Tensor& x) {
  unary_backward<Relu>(dx, dy, x, "relu_backward");
}

void swiglu_forward(Tensor y, const Tensor& gu) {
  const int64_t N = rows_of(gu), F = gu.dim(-1) / 2;
  if (N * F == 0) return;
  dispatch_float(gu.dtype(), "swiglu_forward", [&](auto tag) {
    using T = decltype(tag);
    const cudaStream_t st = nk::cuda::stream();
    constexpr int V = kVec<T>;
    if (F % V == 0 && all_vec_aligned<T>({y.raw(), gu.raw()}))
      swiglu_forward_kernel<T, V>
          <<<blocks_for(N * (F / V)), kThreads, 0, st>>>(y.data<T>(), gu.data<T>(), N, F);
    else
      swiglu_forward_kernel<T, 1>
          <<<blocks_for(N * F), kThreads, 0, st>>>(y.data<T>(), gu.data<T>(), N, F);
    NK_CUDA_LAUNCHED("swiglu_forward_kernel");
  });
}

void swiglu_backward(Tensor dgu, const Tensor& dy, const Tensor& gu) {
  const int64_t N = rows_of(gu), F = gu.dim(-1) / 2;
  if (N * F == 0) return;
  dispatch_float(gu.dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    const cudaStream_t st = nk::cuda::stream();
    constexpr int V = kVec<T>;
    if (F % V == 0 && all_vec_aligned<T>({dgu.raw(), dy.raw(), gu.raw()}))
      swiglu_backward_kernel<T, V><<<blocks_for(N * (F / V)), kThreads, 0, st>>>(
          dgu.data<T>(), dy.data<T>(), gu.data<T>(), N, F);
    else
      swiglu_backward_kernel<T, 1>
          <<<blocks_for(N * F), kThreads, 0, st>>>(dgu.data<T>(), dy.data<T>(), gu.data<T>(), N, F);
    NK_CUDA_LAUNCHED("swiglu_backward_kernel");
  });
}

}  // namespace nk::ops::cuda
