// AdamW on CUDA (arguments checked by ops/adamw.cc): adamw_step over flat f32
// buffers (optionally writing the new params in the compute dtype in the same
// pass), adamw_step_mixed with its moments in f32, bf16 or f16 and a f32 or
// bf16 master (with its remainder), and the bf16 master split/join. Each
// element takes the arithmetic of the CPU's AVX-512 path (ops/cpu/adamw.cc),
// fused multiply-adds where it has them and nowhere else (explicit __f*_rn
// intrinsics, so nvcc contracts nothing): sqrt and division are correctly
// rounded on both sides, so results equal that path's bit for bit.
// f16 moments first measure the new moments' largest magnitudes (an integer
// atomic max over non-negative floats: order-independent, so deterministic),
// then update with the scales those give, then store the scales.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/adamw_step.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/ops.h"

namespace nk::ops::cuda {
namespace {

// mi, vi <- the new moments from the scaled gradient gi.
__device__ __forceinline__ void adam_moments(float gi, float& mi, float& vi, const AdamConsts& k) {
  mi = __fmaf_rn(k.b1, mi, __fmul_rn(1.f - k.b1, gi));
  vi = __fmaf_rn(k.b2, vi, __fmul_rn(__fmul_rn(1.f - k.b2, gi), gi));
}

// The new param from p, the new m and root = sqrt(new v):
// p decay - lr (m rbc1) / (root rbc2_sqrt + eps).
__device__ __forceinline__ float adam_param(float p, float mi, float root, const AdamConsts& k) {
  const float den = __fmaf_rn(root, k.rbc2_sqrt, k.eps);
  const float step = __fdiv_rn(__fmul_rn(k.lr, __fmul_rn(mi, k.rbc1)), den);
  return __fmaf_rn(p, k.decay, -step);
}

// param, m, v [n] (f32) <- one AdamW step with grad [n] (f32); copy [n] <- the
// new param in C (null: none).
template <typename C>
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, C* copy, int64_t n,
                             AdamConsts k) {
  NK_GRID_STRIDE(i, n) {
    float mi = m[i], vi = v[i];
    adam_moments(__fmul_rn(g[i], k.gs), mi, vi, k);
    const float pi = adam_param(p[i], mi, __fsqrt_rn(vi), k);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (copy) copy[i] = store<C>(pi);
  }
}

// ---- adamw_step_mixed ----

// A bf16 master and the 16 bits its f32 value lost (ops/cpu/adamw.cc): hi is
// the f32 pattern rounded to nearest, ties away from zero, so the remainder's
// top bit says whether hi was rounded up.
__device__ __forceinline__ float join_master(uint16_t hi, uint16_t lo) {
  uint32_t u = (uint32_t(hi) << 16) | lo;
  if (lo & 0x8000u) u -= 0x10000u;
  return __uint_as_float(u);
}
__device__ __forceinline__ void split_master(float x, uint16_t& hi, uint16_t& lo) {
  const uint32_t u = __float_as_uint(x);
  lo = uint16_t(u);
  hi = (u & 0x7fffffffu) > 0x7f800000u ? uint16_t((u >> 16) | 0x40u)  // NaN stays NaN
                                       : uint16_t((u + 0x8000u) >> 16);
}

// The power of two putting `largest` in [2^14, 2^15) (1 for 0, inf or NaN),
// as the CPU's f16_moment_scale.
__device__ __forceinline__ float f16_moment_scale(float largest) {
  if (!(largest > 0.f) || !isfinite(largest)) return 1.f;
  return ldexpf(1.f, max(ilogbf(largest) - 14, -126));
}

// The new moments of element i (f16 moments hold m / sm and sqrt(v) / sv).
template <typename M>
__device__ __forceinline__ void new_moments(const M* m, const M* v, const float* g, int64_t i,
                                            float sm, float sv, const AdamConsts& k, float& mi,
                                            float& vi) {
  mi = load(m[i]);
  vi = load(v[i]);
  if constexpr (std::is_same_v<M, f16>) {
    mi = __fmul_rn(mi, sm);
    vi = __fmul_rn(vi, sv);
    vi = __fmul_rn(vi, vi);
  }
  adam_moments(__fmul_rn(g[i], k.gs), mi, vi, k);
}

// maxes [2] (bits of non-negative floats) <- max with the largest |new m| and
// sqrt(new v) over [0, n); m, v f16 [n] scaled by scales [2]. Grid-stride, one
// atomic per block and statistic.
__global__ void adamw_measure_kernel(unsigned* maxes, const float* g, const f16* m, const f16* v,
                                     const float* scales, int64_t n, AdamConsts k) {
  __shared__ float shared_m[32], shared_r[32];
  const float sm = scales[0], sv = scales[1];
  float am = 0.f, ar = 0.f;  // fmaxf drops NaN, as the CPU's max does
  NK_GRID_STRIDE(i, n) {
    float mi, vi;
    new_moments(m, v, g, i, sm, sv, k, mi, vi);
    am = fmaxf(am, fabsf(mi));
    ar = fmaxf(ar, __fsqrt_rn(vi));
  }
  am = block_max(am, shared_m);
  ar = block_max(ar, shared_r);
  if (threadIdx.x == 0) {
    atomicMax(&maxes[0], __float_as_uint(am));
    atomicMax(&maxes[1], __float_as_uint(ar));
  }
}

// master (and remainder), m, v [n] <- one AdamW step with grad [n]; copy [n]
// <- the new f32 master in C (null: none). f16 moments: scales [2] are the
// stored values' scales, maxes [2] the measured largest new values (their
// scales are stored afterwards by adamw_store_scales_kernel); else both null.
template <typename M, MasterKind K, typename C>
__global__ void adamw_mixed_kernel(MixedBuffers b, M* m, M* v, C* copy, const float* scales,
                                   const unsigned* maxes, int64_t n, AdamConsts k) {
  float sm = 1.f, sv = 1.f, inv_m = 1.f, inv_v = 1.f;
  if constexpr (std::is_same_v<M, f16>) {
    sm = scales[0];
    sv = scales[1];
    inv_m = 1.f / f16_moment_scale(__uint_as_float(maxes[0]));
    inv_v = 1.f / f16_moment_scale(__uint_as_float(maxes[1]));
  }
  NK_GRID_STRIDE(i, n) {
    float mi, vi;
    new_moments(m, v, b.g, i, sm, sv, k, mi, vi);
    const float root = __fsqrt_rn(vi);
    float p;
    if constexpr (K == MasterKind::F32)
      p = b.master32[i];
    else if constexpr (K == MasterKind::Bf16Remainder)
      p = join_master(b.master16[i], b.remainder[i]);
    else
      p = load(bf16{b.master16[i]});
    p = adam_param(p, mi, root, k);
    if constexpr (std::is_same_v<M, f16>) {
      m[i] = store<f16>(__fmul_rn(mi, inv_m));
      v[i] = store<f16>(__fmul_rn(root, inv_v));
    } else {
      m[i] = store<M>(mi);
      v[i] = store<M>(vi);
    }
    if constexpr (K == MasterKind::F32) {
      b.master32[i] = p;
      if (copy) copy[i] = store<C>(p);
    } else if constexpr (K == MasterKind::Bf16Remainder) {
      split_master(p, b.master16[i], b.remainder[i]);
    } else {
      b.master16[i] = store<bf16>(p).bits;
    }
  }
}

// scales [2] <- the f16 scales of the measured maxes [2]. One thread.
__global__ void adamw_store_scales_kernel(float* scales, const unsigned* maxes) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    scales[0] = f16_moment_scale(__uint_as_float(maxes[0]));
    scales[1] = f16_moment_scale(__uint_as_float(maxes[1]));
  }
}

template <typename M, MasterKind K, typename C>
void mixed_step(const MixedBuffers& b, M* m, M* v, C* copy, float* scales, int64_t n,
                const AdamConsts& k) {
  const cudaStream_t st = nk::cuda::stream();
  if constexpr (std::is_same_v<M, f16>) {
    Tensor maxes_t = Tensor::empty({2}, DType::I32, Device::CUDA);
    auto* maxes = static_cast<unsigned*>(maxes_t.raw());
    nk::cuda::memset_zero(maxes, 2 * sizeof(unsigned));
    adamw_measure_kernel<<<blocks_for(n), kThreads, 0, st>>>(maxes, b.g, m, v, scales, n, k);
    NK_CUDA_LAUNCHED("adamw_measure_kernel");
    adamw_mixed_kernel<M, K, C>
        <<<blocks_for(n), kThreads, 0, st>>>(b, m, v, copy, scales, maxes, n, k);
    NK_CUDA_LAUNCHED("adamw_mixed_kernel");
    adamw_store_scales_kernel<<<1, 32, 0, st>>>(scales, maxes);
    NK_CUDA_LAUNCHED("adamw_store_scales_kernel");
  } else {
    adamw_mixed_kernel<M, K, C>
        <<<blocks_for(n), kThreads, 0, st>>>(b, m, v, copy, nullptr, nullptr, n, k);
    NK_CUDA_LAUNCHED("adamw_mixed_kernel");
  }
}

// hi, remainder [n] (16-bit; remainder null: not written) <- split of f32 [n].
__global__ void master_split_kernel(uint16_t* hi, uint16_t* rem, const float* x, int64_t n) {
  NK_GRID_STRIDE(i, n) {
    uint16_t a, b;
    split_master(x[i], a, b);
    hi[i] = a;
    if (rem) rem[i] = b;
  }
}

// f32 [n] <- hi [n] joined with remainder [n] (null: hi as a bf16 value).
__global__ void master_join_kernel(float* x, const uint16_t* hi, const uint16_t* rem, int64_t n) {
  NK_GRID_STRIDE(i, n) {
    x[i] = rem ? join_master(hi[i], rem[i]) : load(bf16{hi[i]});
  }
}

// adamw_step_mixed's instantiations (ops/adamw_step.h picks one).
struct MixedStep {
  float* scales;
  int64_t n;
  AdamConsts k;
  template <typename M, MasterKind K, typename C>
  void run(const MixedBuffers& b, M* m, M* v, C* copy) const {
    mixed_step<M, K, C>(b, m, v, copy, scales, n, k);
  }
};

}  // namespace

void adamw_step(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWParams& p,
                Tensor param_copy) {
  const AdamConsts k = adam_consts(p);
  const int64_t n = param.numel();
  if (n == 0) return;
  float *pp = param.data<float>(), *pm = m.data<float>(), *pv = v.data<float>();
  const float* pg = grad.data<float>();
  const cudaStream_t st = nk::cuda::stream();
  if (!param_copy.defined()) {
    adamw_kernel<float><<<blocks_for(n), kThreads, 0, st>>>(pp, pg, pm, pv, nullptr, n, k);
    NK_CUDA_LAUNCHED("adamw_kernel");
    return;
  }
  dispatch_float(param_copy.dtype(), "adamw_step", [&](auto tag) {
    using C = decltype(tag);
    adamw_kernel<C><<<blocks_for(n), kThreads, 0, st>>>(pp, pg, pm, pv, param_copy.data<C>(), n, k);
    NK_CUDA_LAUNCHED("adamw_kernel");
  });
}

void adamw_step_mixed(Tensor master, Tensor remainder, const Tensor& grad, Tensor m, Tensor v,
                      Tensor scales, const AdamWParams& p, Tensor param_copy) {
  const int64_t n = master.numel();
  if (n == 0) return;
  const MixedStep step{scales.defined() ? scales.data<float>() : nullptr, n, adam_consts(p)};
  dispatch_adamw_mixed(master, remainder, grad, m, v, param_copy, step);
}

void bf16_master_split(Tensor hi, Tensor remainder, const Tensor& f32) {
  const int64_t n = f32.numel();
  if (n == 0) return;
  master_split_kernel<<<blocks_for(n), kThreads, 0, nk::cuda::stream()>>>(
      static_cast<uint16_t*>(hi.raw()),
      remainder.defined() ? static_cast<uint16_t*>(remainder.raw()) : nullptr, f32.data<float>(),
      n);
  NK_CUDA_LAUNCHED("master_split_kernel");
}

void bf16_master_join(Tensor f32, const Tensor& hi, const Tensor& remainder) {
  const int64_t n = f32.numel();
  if (n == 0) return;
  master_join_kernel<<<blocks_for(n), kThreads, 0, nk::cuda::stream()>>>(
      f32.data<float>(), static_cast<const uint16_t*>(hi.raw()),
      remainder.defined() ? static_cast<const uint16_t*>(remainder.raw()) : nullptr, n);
  NK_CUDA_LAUNCHED("master_join_kernel");
}

}  // namespace nk::ops::cuda
