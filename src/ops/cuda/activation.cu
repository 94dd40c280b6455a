// GELU (tanh form), SiLU, ReLU and SwiGLU on CUDA (arguments checked by
// ops/activation.cc; CPU twins in ops/cpu/activation.cc, whose formulas these
// are): grid-stride loops, fp32 arithmetic, the library's accurate expf. The
// tanh form is rewritten as the CPU has it: 0.5 (1 + tanh u) = sigmoid(2u),
// which has no cancellation. Every element is read before it is written, so
// the outputs may alias the inputs where ops.h allows it.
#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/shapes.h"

namespace nk::ops::cuda {
namespace {

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float sigmoid(float v) {
  return 1.f / (1.f + expf(-v));
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

// y T[n] <- f(x T[n])
template <typename T, typename Act>
__global__ void unary_forward_kernel(T* y, const T* x, int64_t n) {
  NK_GRID_STRIDE(i, n) y[i] = store<T>(Act::f(load(x[i])));
}

// dx T[n] <- dy T[n] * f'(x T[n])
template <typename T, typename Act>
__global__ void unary_backward_kernel(T* dx, const T* dy, const T* x, int64_t n) {
  NK_GRID_STRIDE(i, n) dx[i] = store<T>(load(dy[i]) * Act::grad(load(x[i])));
}

// y T[N, F] <- silu(gu T[N, 2F][:, :F]) * gu[:, F:]
template <typename T>
__global__ void swiglu_forward_kernel(T* y, const T* gu, int64_t N, int64_t F) {
  NK_GRID_STRIDE(i, N * F) {
    const int64_t n = i / F, f = i % F;
    const T* g = gu + n * 2 * F + f;
    const float gv = load(g[0]);
    y[i] = store<T>(gv * sigmoid(gv) * load(g[F]));
  }
}

// dgu T[N, 2F] <- [dy * u * silu'(g) | dy * silu(g)] from dy T[N, F], gu T[N, 2F] = [g | u]
template <typename T>
__global__ void swiglu_backward_kernel(T* dgu, const T* dy, const T* gu, int64_t N, int64_t F) {
  NK_GRID_STRIDE(i, N * F) {
    const int64_t n = i / F, f = i % F;
    const T* g = gu + n * 2 * F + f;
    const float gv = load(g[0]), uv = load(g[F]), dv = load(dy[i]);
    const float s = sigmoid(gv);
    T* dg = dgu + n * 2 * F + f;
    dg[0] = store<T>(dv * uv * s * (1.f + gv * (1.f - s)));
    dg[F] = store<T>(dv * gv * s);
  }
}

template <typename Act>
void unary_forward(Tensor& y, const Tensor& x, const char* op) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    unary_forward_kernel<T, Act>
        <<<blocks_for(n), kThreads, 0, nk::cuda::stream()>>>(y.data<T>(), x.data<T>(), n);
    NK_CUDA_LAUNCHED(op);
  });
}

template <typename Act>
void unary_backward(Tensor& dx, const Tensor& dy, const Tensor& x, const char* op) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    unary_backward_kernel<T, Act><<<blocks_for(n), kThreads, 0, nk::cuda::stream()>>>(
        dx.data<T>(), dy.data<T>(), x.data<T>(), n);
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
    swiglu_forward_kernel<T>
        <<<blocks_for(N * F), kThreads, 0, nk::cuda::stream()>>>(y.data<T>(), gu.data<T>(), N, F);
    NK_CUDA_LAUNCHED("swiglu_forward_kernel");
  });
}

void swiglu_backward(Tensor dgu, const Tensor& dy, const Tensor& gu) {
  const int64_t N = rows_of(gu), F = gu.dim(-1) / 2;
  if (N * F == 0) return;
  dispatch_float(gu.dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    swiglu_backward_kernel<T><<<blocks_for(N * F), kThreads, 0, nk::cuda::stream()>>>(
        dgu.data<T>(), dy.data<T>(), gu.data<T>(), N, F);
    NK_CUDA_LAUNCHED("swiglu_backward_kernel");
  });
}

}  // namespace nk::ops::cuda
