// Causal grouped-query attention on CUDA (arguments checked by ops/attention.cc):
// qkv T[B,T,(Hq+2*Hkv)*D] packs per token [q heads | k heads | v heads];
// out T[B,T,Hq*D]; lse f32[B,Hq,T]; dqkv like qkv. T is f32 or bf16, fp32 inside.
// Head dims up to kMaxHeadDim (256); larger ones are refused.
//
// bf16 with head dims 32, 64 and 128 (16-byte aligned tensors) goes to the
// tensor-core kernels of flash_attention.cu, after the cu_seqlens check and
// the `starts` expansion below (the one copy of both); everything else runs
// the CUDA-core kernels of this file:
//
// Forward: one block of 4 warps per (batch, query head, tile of 16 query rows),
// each warp owning 4 rows. Key tiles of 32 rows (k and v of the head's kv head,
// converted to fp32) stream through shared memory, shared by the tile's rows;
// per row a lane scores one key of the tile (a dot product against the row's
// pre-scaled q in shared memory), and the row keeps an online softmax (running
// max m and sum l, fp32) and its output in registers (lane c holds columns
// c, c+32, ...). lse = m + log l is saved.
//
// Backward, deterministic and without float atomics (every element of dqkv has
// one writer and a fixed summation order):
//   1. Drow f32[B,Hq,T] = rowsum(dO * O): one warp per (batch, token, head).
//   2. dQ: the forward's schedule again; per key tile a lane recomputes its
//      key's p = exp(s - lse) and dS = p (dp - Drow), dp = dO . v, and the row
//      accumulates dq += dS k, scaled by 1/sqrt(D) when written.
//   3. dK, dV: one block of 4 warps per (batch, kv head, tile of 16 key rows),
//      each warp owning 4 key rows. For each query head of the group, query
//      tiles of 32 rows that can see the key tile stream through shared memory
//      (q pre-scaled, dO, lse, Drow); a lane recomputes one query's p and dS for
//      the key row, and the row accumulates dv += p dO and dk += dS q.
//
// Packed rows and sliding windows: cu_seqlens is validated on the device (a
// bad row is an nk::Error with the CPU kernel's text, read back through
// ErrorFlag) and, with the window, expanded into each token's first visible key
// starts[b, t] = max(document start, t - window + 1), nondecreasing in t. Query
// t sees keys [starts[t], t]; tiles wholly outside that span are skipped and
// the rest masked per row. The tiles sit at fixed multiples of their size, so
// the arithmetic of a row depends only on the keys it sees: a window >= T or a
// single document per row gives plain causal attention's bits.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/flash_attention.h"
#include "ops/cuda/kernels.h"

namespace nk::ops::cuda {
namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kWarps = 4;                 // warps per block
constexpr int kRows = 4;                  // rows (query or key) per warp
constexpr int kRowTile = kWarps * kRows;  // rows per block: 16
constexpr int kLaneTile = 32;             // tile rows scored one per lane
constexpr size_t kDefaultSmem = 48 * 1024;

struct Dims {
  int64_t B, T;
  int Hq, Hkv, D;
  int64_t C;  // (Hq + 2*Hkv)*D elements per token in qkv
};

Dims dims_of(const Tensor& qkv, int64_t hq, int64_t hkv) {
  const int64_t c = qkv.dim(2), d = c / (hq + 2 * hkv);
  if (d > kMaxHeadDim)
    fail("attention: head_dim {} is above the CUDA kernels' limit of {}", d, kMaxHeadDim);
  NK_CHECK(qkv.dim(0) <= 65535 && hq <= 65535, "attention: B = {} or Hq = {} above 65535",
           qkv.dim(0), hq);
  return {qkv.dim(0), qkv.dim(1), int(hq), int(hkv), int(d), c};
}

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}
__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) {
  return a > b ? a : b;
}

// Odd row stride of the tiles read one row per lane: conflict-free shared banks.
__host__ __device__ __forceinline__ int odd_ld(int D) {
  return D | 1;
}

// fn(std::integral_constant<int, P>) with P = columns per lane (32 * P >= D).
template <typename Fn>
void dispatch_per_lane(int D, Fn&& fn) {
  if (D <= 32)
    fn(std::integral_constant<int, 1>{});
  else if (D <= 64)
    fn(std::integral_constant<int, 2>{});
  else if (D <= 128)
    fn(std::integral_constant<int, 4>{});
  else
    fn(std::integral_constant<int, 8>{});
}

// fn(T{}) for the dtypes the op accepts (f32, bf16).
template <typename Fn>
void dispatch_dtype(DType dt, const char* op, Fn&& fn) {
  if (dt == DType::F32)
    fn(float{});
  else if (dt == DType::BF16)
    fn(bf16{});
  else
    NK_CHECK(false, "{}: unsupported dtype {}", op, dtype_name(dt));
}

// Lets `kernel` use `bytes` of dynamic shared memory (above 48 KiB needs the opt-in).
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > kDefaultSmem)
    NK_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// ---- document starts ----

// cu i32[B, n]: reports an entry that breaks 0 = c_0 <= ... <= c_{n-1} = T.
__global__ void check_cu_seqlens_kernel(DeviceError e, const int32_t* cu, int64_t B, int64_t n,
                                        int64_t T) {
  NK_GRID_STRIDE(i, B * n) {
    const int64_t k = i % n;
    const int32_t c = cu[i];
    if ((k == 0 && c != 0) || (k == n - 1 && c != T) || (k + 1 < n && cu[i + 1] < c))
      report(e, i, c);
  }
}

// starts i32[B, T] <- token t's first visible key: max(largest c_k <= t of
// cu i32[B, n] (validated; null: 0), t - window + 1 (window > 0)).
__global__ void first_keys_kernel(int32_t* starts, const int32_t* cu, int64_t B, int64_t n,
                                  int64_t T, int64_t window) {
  NK_GRID_STRIDE(i, B * T) {
    const int64_t b = i / T, t = i % T;
    int64_t s = 0;
    if (cu) {
      const int32_t* c = cu + b * n;
      int64_t lo = 0, hi = n - 1;  // c[lo] <= t < c[hi]
      while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        if (c[mid] <= t)
          lo = mid;
        else
          hi = mid;
      }
      s = c[lo];
    }
    if (window > 0) s = imax(s, t - window + 1);
    starts[i] = int32_t(s);
  }
}

// The CPU kernel's error for the first bad row of cu (copied to the host).
[[noreturn]] void fail_cu_seqlens(const Tensor& cu, int64_t T) {
  const int64_t B = cu.dim(0), n = cu.dim(1);
  std::vector<int32_t> h(size_t(B * n));
  nk::cuda::copy_to_host(h.data(), cu.raw(), h.size() * sizeof(int32_t));
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* c = h.data() + b * n;
    if (c[0] != 0 || c[n - 1] != T)
      fail("attention: cu_seqlens row {} runs from {} to {}; it must run from 0 to T = {}", b, c[0],
           c[n - 1], T);
    for (int64_t k = 0; k + 1 < n; ++k)
      if (c[k + 1] < c[k])
        fail("attention: cu_seqlens row {} decreases at entry {} ({} after {})", b, k + 1, c[k + 1],
             c[k]);
  }
  fail("attention: cu_seqlens was rejected on the device but reads as valid");
}

// Each token's first visible key i32[B, T], or an undefined tensor when
// neither cu_seqlens nor the window restricts plain causal attention.
// Validates cu_seqlens first (one small read-back).
Tensor first_keys(const Tensor& cu, int64_t window, const Dims& d) {
  if (window >= d.T) window = 0;  // every query's window reaches back to key 0
  cudaStream_t st = nk::cuda::stream();
  const int32_t* c = cu.defined() ? cu.data<int32_t>() : nullptr;
  const int64_t n = cu.defined() ? cu.dim(1) : 0;
  if (c) {
    ErrorFlag flag;
    check_cu_seqlens_kernel<<<blocks_for(d.B * n), kThreads, 0, st>>>(flag.device(), c, d.B, n,
                                                                      d.T);
    NK_CUDA_LAUNCHED("check_cu_seqlens_kernel");
    if (flag.read().first >= 0) fail_cu_seqlens(cu, d.T);
  }
  if (!c && window == 0) return Tensor();
  Tensor starts = Tensor::empty({d.B, d.T}, DType::I32, Device::CUDA);
  if (d.B * d.T > 0) {
    first_keys_kernel<<<blocks_for(d.B * d.T), kThreads, 0, st>>>(starts.data<int32_t>(), c, d.B, n,
                                                                  d.T, window);
    NK_CUDA_LAUNCHED("first_keys_kernel");
  }
  return starts;
}

// ---- forward ----

// out T[B,T,Hq*D], lse f32[B,Hq,T] <- qkv T[B,T,C]; starts i32[B,T] or null.
// grid (ceil(T/16), Hq, B), block 128: warp w owns query rows w, w+4, w+8, w+12
// of the tile. Dynamic shared: Q [16, D] (scaled), K [32, ld], V [32, D].
template <typename T, int P>
__global__ void __launch_bounds__(kWarps * 32)
    attention_forward_kernel(T* out, float* lse, const T* qkv, const int32_t* starts, int64_t Tn,
                             int Hq, int Hkv, int D, float scale) {
  extern __shared__ float smem[];
  const int ld = odd_ld(D);
  float* qs = smem;
  float* ks = qs + kRowTile * D;
  float* vs = ks + kLaneTile * ld;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int h = blockIdx.y, kvh = h / (Hq / Hkv);
  const int64_t b = blockIdx.z, C = int64_t(Hq + 2 * Hkv) * D;
  const int64_t q0 = int64_t(blockIdx.x) * kRowTile;
  const int qn = int(imin(kRowTile, Tn - q0));
  const T* base = qkv + b * Tn * C;
  const int32_t* st = starts ? starts + b * Tn : nullptr;

  for (int i = threadIdx.x; i < kRowTile * D; i += blockDim.x) {
    const int r = i / D, c = i % D;
    qs[i] = r < qn ? scale * load(base[(q0 + r) * C + int64_t(h) * D + c]) : 0.f;
  }
  float o[kRows][P], m[kRows], l[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int e = 0; e < P; ++e) o[i][e] = 0.f;
  }

  const int64_t k_first = st ? st[q0] : 0, k_last = q0 + qn - 1;
  for (int64_t k0 = k_first / kLaneTile * kLaneTile; k0 <= k_last; k0 += kLaneTile) {
    const int kn = int(imin(kLaneTile, Tn - k0));
    __syncthreads();  // Q is loaded; the previous tile's readers are done
    for (int i = threadIdx.x; i < kLaneTile * D; i += blockDim.x) {
      const int r = i / D, c = i % D;
      float kv = 0.f, vv = 0.f;
      if (r < kn) {
        const T* row = base + (k0 + r) * C;
        kv = load(row[int64_t(Hq + kvh) * D + c]);
        vv = load(row[int64_t(Hq + Hkv + kvh) * D + c]);
      }
      ks[r * ld + c] = kv;
      vs[r * D + c] = vv;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = warp + kWarps * i;
      if (r >= qn) continue;  // warp-uniform, as are jlo and jhi
      const int64_t t = q0 + r, lo = st ? st[t] : 0;
      const int jlo = int(imax(lo, k0) - k0), jhi = int(imin(t + 1, k0 + kn) - k0);
      if (jlo >= jhi) continue;  // the row sees no key of this tile
      const bool valid = lane >= jlo && lane < jhi;
      float s = -INFINITY;
      if (valid) {
        const float* q = qs + r * D;
        const float* k = ks + lane * ld;
        float acc = 0.f;
        for (int c = 0; c < D; ++c) acc += q[c] * k[c];
        s = acc;
      }
      const float m_new = fmaxf(m[i], warp_max(s));  // finite: some lane is valid
      const float corr = expf(m[i] - m_new);         // 0 on the row's first tile
      const float p = valid ? expf(s - m_new) : 0.f;
      l[i] = l[i] * corr + warp_sum(p);
      m[i] = m_new;
#pragma unroll
      for (int e = 0; e < P; ++e) o[i][e] *= corr;
      for (int j = jlo; j < jhi; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
        const float* v = vs + j * D;
#pragma unroll
        for (int e = 0; e < P; ++e) {
          const int c = lane + 32 * e;
          if (c < D) o[i][e] += pj * v[c];
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = warp + kWarps * i;
    if (r >= qn) continue;
    const int64_t t = q0 + r;
    const float inv = 1.f / l[i];
    T* dst = out + (b * Tn + t) * Hq * D + int64_t(h) * D;
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const int c = lane + 32 * e;
      if (c < D) dst[c] = store<T>(o[i][e] * inv);
    }
    if (lane == 0) lse[(b * Hq + h) * Tn + t] = m[i] + logf(l[i]);
  }
}

// ---- backward ----

// drow f32[B,Hq,T] <- rowsum(dout * out) over each head's D columns; dout, out
// T[B,T,Hq*D]. One warp per (b, t, h) row, grid-stride.
template <typename T>
__global__ void attention_drow_kernel(float* drow, const T* dout, const T* out, int64_t rows,
                                      int64_t Tn, int Hq, int D) {
  const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
  const int64_t step = int64_t(gridDim.x) * wpb;
  for (int64_t r = int64_t(blockIdx.x) * wpb + (threadIdx.x >> 5); r < rows; r += step) {
    const T *g = dout + r * D, *o = out + r * D;  // row r = (b*T + t)*Hq + h
    float acc = 0.f;
    for (int c = lane; c < D; c += 32) acc += load(g[c]) * load(o[c]);
    acc = warp_sum(acc);
    if (lane == 0) {
      const int64_t h = r % Hq, bt = r / Hq, t = bt % Tn, b = bt / Tn;
      drow[(b * Hq + h) * Tn + t] = acc;
    }
  }
}

// dq part of dqkv T[B,T,C] <- dout T[B,T,Hq*D], qkv, lse and drow f32[B,Hq,T];
// starts i32[B,T] or null. grid (ceil(T/16), Hq, B), block 128, rows as the
// forward. Dynamic shared: Q [16, D] (scaled), dO [16, D], K, V [32, ld].
template <typename T, int P>
__global__ void __launch_bounds__(kWarps * 32)
    attention_backward_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                 const float* drow, const int32_t* starts, int64_t Tn, int Hq,
                                 int Hkv, int D, float scale) {
  extern __shared__ float smem[];
  const int ld = odd_ld(D);
  float* qs = smem;
  float* dos = qs + kRowTile * D;
  float* ks = dos + kRowTile * D;
  float* vs = ks + kLaneTile * ld;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int h = blockIdx.y, kvh = h / (Hq / Hkv);
  const int64_t b = blockIdx.z, C = int64_t(Hq + 2 * Hkv) * D, OC = int64_t(Hq) * D;
  const int64_t q0 = int64_t(blockIdx.x) * kRowTile;
  const int qn = int(imin(kRowTile, Tn - q0));
  const T* base = qkv + b * Tn * C;
  const int32_t* st = starts ? starts + b * Tn : nullptr;
  const float* lse_h = lse + (b * Hq + h) * Tn;
  const float* drow_h = drow + (b * Hq + h) * Tn;

  for (int i = threadIdx.x; i < kRowTile * D; i += blockDim.x) {
    const int r = i / D, c = i % D;
    const bool in = r < qn;
    qs[i] = in ? scale * load(base[(q0 + r) * C + int64_t(h) * D + c]) : 0.f;
    dos[i] = in ? load(dout[(b * Tn + q0 + r) * OC + int64_t(h) * D + c]) : 0.f;
  }
  float dq[kRows][P];
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int e = 0; e < P; ++e) dq[i][e] = 0.f;

  const int64_t k_first = st ? st[q0] : 0, k_last = q0 + qn - 1;
  for (int64_t k0 = k_first / kLaneTile * kLaneTile; k0 <= k_last; k0 += kLaneTile) {
    const int kn = int(imin(kLaneTile, Tn - k0));
    __syncthreads();  // Q, dO loaded; the previous tile's readers are done
    for (int i = threadIdx.x; i < kLaneTile * D; i += blockDim.x) {
      const int r = i / D, c = i % D;
      float kv = 0.f, vv = 0.f;
      if (r < kn) {
        const T* row = base + (k0 + r) * C;
        kv = load(row[int64_t(Hq + kvh) * D + c]);
        vv = load(row[int64_t(Hq + Hkv + kvh) * D + c]);
      }
      ks[r * ld + c] = kv;
      vs[r * ld + c] = vv;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = warp + kWarps * i;
      if (r >= qn) continue;  // warp-uniform, as are jlo and jhi
      const int64_t t = q0 + r, lo = st ? st[t] : 0;
      const int jlo = int(imax(lo, k0) - k0), jhi = int(imin(t + 1, k0 + kn) - k0);
      if (jlo >= jhi) continue;
      const bool valid = lane >= jlo && lane < jhi;
      float ds = 0.f;
      if (valid) {
        const float *q = qs + r * D, *g = dos + r * D;
        const float *k = ks + lane * ld, *v = vs + lane * ld;
        float s = 0.f, dp = 0.f;
        for (int c = 0; c < D; ++c) {
          s += q[c] * k[c];
          dp += g[c] * v[c];
        }
        const float p = expf(s - lse_h[t]);
        ds = p * (dp - drow_h[t]);
      }
      for (int j = jlo; j < jhi; ++j) {
        const float dsj = __shfl_sync(0xffffffffu, ds, j);
        const float* k = ks + j * ld;
#pragma unroll
        for (int e = 0; e < P; ++e) {
          const int c = lane + 32 * e;
          if (c < D) dq[i][e] += dsj * k[c];
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = warp + kWarps * i;
    if (r >= qn) continue;
    T* dst = dqkv + (b * Tn + q0 + r) * C + int64_t(h) * D;
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const int c = lane + 32 * e;
      if (c < D) dst[c] = store<T>(scale * dq[i][e]);
    }
  }
}

// dk, dv parts of dqkv T[B,T,C] <- dout T[B,T,Hq*D], qkv, lse and drow
// f32[B,Hq,T]; starts i32[B,T] or null. grid (ceil(T/16), Hkv, B), block 128:
// warp w owns key rows w, w+4, w+8, w+12 of the tile. For each query head of
// the group, the query tiles of 32 rows that see the key tile pass through
// shared memory. Dynamic shared: K, V [16, D]; Q (scaled), dO [32, ld].
template <typename T, int P>
__global__ void __launch_bounds__(kWarps * 32)
    attention_backward_dkv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                  const float* drow, const int32_t* starts, int64_t Tn, int Hq,
                                  int Hkv, int D, float scale) {
  extern __shared__ float smem[];
  __shared__ float lse_s[kLaneTile], drow_s[kLaneTile];
  __shared__ int32_t st_s[kLaneTile];
  const int ld = odd_ld(D);
  float* ks = smem;
  float* vs = ks + kRowTile * D;
  float* qs = vs + kRowTile * D;
  float* dos = qs + kLaneTile * ld;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kvh = blockIdx.y, G = Hq / Hkv;
  const int64_t b = blockIdx.z, C = int64_t(Hq + 2 * Hkv) * D, OC = int64_t(Hq) * D;
  const int64_t k0 = int64_t(blockIdx.x) * kRowTile;
  const int kn = int(imin(kRowTile, Tn - k0));
  const int64_t k_last = k0 + kn - 1;
  const T* base = qkv + b * Tn * C;
  const int32_t* st = starts ? starts + b * Tn : nullptr;
  const int64_t koff = int64_t(Hq + kvh) * D, voff = int64_t(Hq + Hkv + kvh) * D;

  for (int i = threadIdx.x; i < kRowTile * D; i += blockDim.x) {
    const int r = i / D, c = i % D;
    const bool in = r < kn;
    ks[i] = in ? load(base[(k0 + r) * C + koff + c]) : 0.f;
    vs[i] = in ? load(base[(k0 + r) * C + voff + c]) : 0.f;
  }
  float dk[kRows][P], dv[kRows][P];
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int e = 0; e < P; ++e) dk[i][e] = dv[i][e] = 0.f;

  for (int g = 0; g < G; ++g) {
    const int h = kvh * G + g;
    const float* lse_h = lse + (b * Hq + h) * Tn;
    const float* drow_h = drow + (b * Hq + h) * Tn;
    for (int64_t q0 = k0 / kLaneTile * kLaneTile; q0 < Tn; q0 += kLaneTile) {
      // starts is nondecreasing: this and later query tiles see none of the keys.
      if (st && st[q0] > k_last) break;
      const int qn = int(imin(kLaneTile, Tn - q0));
      __syncthreads();  // K, V loaded; the previous query tile's readers are done
      for (int i = threadIdx.x; i < kLaneTile * D; i += blockDim.x) {
        const int r = i / D, c = i % D;
        const bool in = r < qn;
        qs[r * ld + c] = in ? scale * load(base[(q0 + r) * C + int64_t(h) * D + c]) : 0.f;
        dos[r * ld + c] = in ? load(dout[(b * Tn + q0 + r) * OC + int64_t(h) * D + c]) : 0.f;
      }
      if (threadIdx.x < kLaneTile) {
        const int r = threadIdx.x;
        const bool in = r < qn;
        lse_s[r] = in ? lse_h[q0 + r] : 0.f;
        drow_s[r] = in ? drow_h[q0 + r] : 0.f;
        st_s[r] = in ? (st ? st[q0 + r] : 0) : INT32_MAX;  // rows past T see nothing
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int r = warp + kWarps * i;
        if (r >= kn) continue;  // warp-uniform, as are ilo and ihi
        const int64_t kj = k0 + r;
        // Queries q0 + lane seeing key kj: lane >= kj - q0 and st <= kj, a
        // prefix of the tile (st nondecreasing): lanes [ilo, ihi).
        const unsigned seen = __ballot_sync(0xffffffffu, st_s[lane] <= kj);
        const int ilo = int(imax(kj - q0, 0)), ihi = seen ? 32 - __clz(int(seen)) : 0;
        if (ilo >= ihi) continue;
        const bool valid = lane >= ilo && lane < ihi;
        float p = 0.f, ds = 0.f;
        if (valid) {
          const float *q = qs + lane * ld, *go = dos + lane * ld;
          const float *k = ks + r * D, *v = vs + r * D;
          float s = 0.f, dp = 0.f;
          for (int c = 0; c < D; ++c) {
            s += q[c] * k[c];
            dp += go[c] * v[c];
          }
          p = expf(s - lse_s[lane]);
          ds = p * (dp - drow_s[lane]);
        }
        for (int j = ilo; j < ihi; ++j) {
          const float pj = __shfl_sync(0xffffffffu, p, j);
          const float dsj = __shfl_sync(0xffffffffu, ds, j);
          const float *q = qs + j * ld, *go = dos + j * ld;
#pragma unroll
          for (int e = 0; e < P; ++e) {
            const int c = lane + 32 * e;
            if (c < D) {
              dv[i][e] += pj * go[c];
              dk[i][e] += dsj * q[c];
            }
          }
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = warp + kWarps * i;
    if (r >= kn) continue;
    T* row = dqkv + (b * Tn + k0 + r) * C;
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const int c = lane + 32 * e;
      if (c < D) {
        row[koff + c] = store<T>(dk[i][e]);
        row[voff + c] = store<T>(dv[i][e]);
      }
    }
  }
}

unsigned row_tiles(int64_t T, int tile) {
  return unsigned((T + tile - 1) / tile);
}

// The CUDA kernels score with 1/sqrt(D) and no soft-capping (Gemma's
// query_pre_attn_scalar and attn_logit_softcapping run on the CPU).
void check_plain_scores(const char* op, float scale, float softcap, int64_t D) {
  if (softcap > 0.f)
    fail("{}: soft-capped attention scores (softcap {}) are not implemented on CUDA yet", op,
         softcap);
  if (scale != 0.f && std::abs(scale * std::sqrt(float(D)) - 1.f) > 1e-6f)
    fail("{}: an attention scale of {} (not 1/sqrt(head_dim {})) is not implemented on CUDA yet",
         op, scale, D);
}

}  // namespace

void attention_forward(Tensor out, Tensor lse, const Tensor& qkv, int64_t n_q_heads,
                       int64_t n_kv_heads, const Tensor& cu_seqlens, int64_t window, float scale_in,
                       float softcap) {
  const Dims d = dims_of(qkv, n_q_heads, n_kv_heads);
  check_plain_scores("attention_forward", scale_in, softcap, d.D);
  const Tensor starts = first_keys(cu_seqlens, window, d);
  if (d.B * d.T == 0) return;
  if (flash_attention_supported(qkv.dtype(), d.D, {&out, &qkv})) {
    flash_attention_forward(out, lse, qkv, d.Hq, d.Hkv, starts);
    return;
  }
  const int32_t* st = starts.defined() ? starts.data<int32_t>() : nullptr;
  const float scale = 1.f / std::sqrt(float(d.D));
  const dim3 grid(row_tiles(d.T, kRowTile), unsigned(d.Hq), unsigned(d.B));
  const size_t smem =
      sizeof(float) * size_t(kRowTile * d.D + kLaneTile * odd_ld(d.D) + kLaneTile * d.D);
  dispatch_dtype(qkv.dtype(), "attention_forward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_per_lane(d.D, [&](auto per) {
      constexpr int P = decltype(per)::value;
      allow_smem(attention_forward_kernel<T, P>, smem);
      attention_forward_kernel<T, P><<<grid, kWarps * 32, smem, nk::cuda::stream()>>>(
          out.data<T>(), lse.data<float>(), qkv.data<T>(), st, d.T, d.Hq, d.Hkv, d.D, scale);
      NK_CUDA_LAUNCHED("attention_forward_kernel");
    });
  });
}

void attention_backward(Tensor dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, int64_t n_q_heads, int64_t n_kv_heads,
                        const Tensor& cu_seqlens, int64_t window, float scale_in, float softcap) {
  const Dims d = dims_of(qkv, n_q_heads, n_kv_heads);
  check_plain_scores("attention_backward", scale_in, softcap, d.D);
  const Tensor starts = first_keys(cu_seqlens, window, d);
  if (d.B * d.T == 0) return;
  if (flash_attention_supported(qkv.dtype(), d.D, {&dqkv, &dout, &qkv, &out})) {
    flash_attention_backward(dqkv, dout, qkv, out, lse, d.Hq, d.Hkv, starts);
    return;
  }
  const int32_t* st = starts.defined() ? starts.data<int32_t>() : nullptr;
  const float scale = 1.f / std::sqrt(float(d.D));
  cudaStream_t stream = nk::cuda::stream();
  Tensor drow = Tensor::empty({d.B, d.Hq, d.T}, DType::F32, Device::CUDA);
  const int64_t rows = d.B * d.T * d.Hq;
  const int ld = odd_ld(d.D);
  const size_t smem_dq = sizeof(float) * size_t(2 * kRowTile * d.D + 2 * kLaneTile * ld);
  const size_t smem_dkv = sizeof(float) * size_t(2 * kRowTile * d.D + 2 * kLaneTile * ld);
  dispatch_dtype(qkv.dtype(), "attention_backward", [&](auto tag) {
    using T = decltype(tag);
    attention_drow_kernel<T><<<blocks_for(rows * 32), kThreads, 0, stream>>>(
        drow.data<float>(), dout.data<T>(), out.data<T>(), rows, d.T, d.Hq, d.D);
    NK_CUDA_LAUNCHED("attention_drow_kernel");
    dispatch_per_lane(d.D, [&](auto per) {
      constexpr int P = decltype(per)::value;
      allow_smem(attention_backward_dq_kernel<T, P>, smem_dq);
      attention_backward_dq_kernel<T, P>
          <<<dim3(row_tiles(d.T, kRowTile), unsigned(d.Hq), unsigned(d.B)), kWarps * 32, smem_dq,
             stream>>>(dqkv.data<T>(), dout.data<T>(), qkv.data<T>(), lse.data<float>(),
                       drow.data<float>(), st, d.T, d.Hq, d.Hkv, d.D, scale);
      NK_CUDA_LAUNCHED("attention_backward_dq_kernel");
      allow_smem(attention_backward_dkv_kernel<T, P>, smem_dkv);
      attention_backward_dkv_kernel<T, P>
          <<<dim3(row_tiles(d.T, kRowTile), unsigned(d.Hkv), unsigned(d.B)), kWarps * 32, smem_dkv,
             stream>>>(dqkv.data<T>(), dout.data<T>(), qkv.data<T>(), lse.data<float>(),
                       drow.data<float>(), st, d.T, d.Hq, d.Hkv, d.D, scale);
      NK_CUDA_LAUNCHED("attention_backward_dkv_kernel");
    });
  });
}

}  // namespace nk::ops::cuda
