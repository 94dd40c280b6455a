// LayerNorm and RMSNorm on CUDA (arguments checked by ops/norm.cc): x, y, dx,
// dy T[N,C]; w, b T[C]; mean, rstd f32[N]; dw, db f32[C], accumulated. fp32
// inside. Rows of up to 32 * kSlotMax vectors (forward: C <= 4096 in bf16,
// 2048 in f32, 512 when C or a pointer does not allow 16-byte vectors;
// backward: C <= 1024, or 512) run one warp per row, kRowWarps rows per block:
// each lane holds its vectors of the row in registers (16-byte loads when C
// and the pointers allow, else one element at a time), so x (and dy) are read
// once. Longer rows run one block per row, as before.
// dw/db are summed without float atomics: with the warp-per-row backward
// each block sums its fixed chunk of rows in a fixed order into a
// partial row of an f32 [chunks, C] buffer as it computes dx; otherwise a
// [column tiles, row chunks] grid does so after the dx pass. A last kernel adds
// the partials in chunk order into dw/db, so the result depends on N and C alone.
#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/shapes.h"

namespace nk::ops::cuda {
namespace {

// dw/db partial sums of the block-per-row path: a block covers kTileCols columns
// and a chunk of rows, kTileRows threads per column walking the chunk's rows in
// a fixed stride.
constexpr int kTileCols = 32, kTileRows = 8;
constexpr int64_t kChunkRows = 256;  // at least; more when N needs > 65535 chunks

// The warp-per-row kernels: kRowWarps warps (rows at once) per block; a lane
// holds S "slots" of VEC elements, S one of kSlotSizes up to kSlotMax (the
// forward) or kSlotElemsBwd / VEC (the backward, which also keeps dw and db
// sums of its S * VEC columns).
constexpr int kRowWarps = 8;
constexpr int kSlotSizes[] = {1, 2, 3, 4, 6, 8, 12, 16};
constexpr int kSlotMax = 16;
constexpr int kSlotElemsBwd = 32;
constexpr int kParamCols = 32 * kSlotElemsBwd;  // the longest row of the warp backward
// Rows of one warp of the backward: at least kMinWarpRows, more when N would
// make more than kMaxChunks blocks (partial rows).
constexpr int64_t kMinWarpRows = 4, kMaxChunks = 2048;

// fn(std::integral_constant<int, S>) for the smallest S of kSlotSizes with S >=
// need and S <= MAX; false (fn not called) when there is none.
template <int MAX, int I = 0, typename Fn>
bool with_slots(int64_t need, Fn&& fn) {
  if constexpr (I < int(sizeof(kSlotSizes) / sizeof(kSlotSizes[0]))) {
    constexpr int S = kSlotSizes[I];
    if constexpr (S <= MAX) {
      if (need <= S) {
        fn(std::integral_constant<int, S>{});
        return true;
      }
      return with_slots<MAX, I + 1>(need, fn);
    }
  }
  return false;
}

// y [N, C] <- (x - mean) rstd w [C] + b [C] per row of x [N, C] (b null: no
// bias), rstd = 1 / sqrt(mean((x - mean)^2) + eps); mean, rstd [N]. mean null:
// RMSNorm, no centring (x rstd w, rstd = 1 / sqrt(mean(x^2) + eps)). One warp per
// row; lane l holds the row's vectors l, l + 32, ... (C a multiple of VEC, S
// slots of VEC elements enough for the row), read before y is written: y may be x.
template <typename T, int VEC, int S>
__global__ void __launch_bounds__(kRowWarps * 32)
    norm_forward_warp_kernel(T* y, float* mean, float* rstd, const T* x, const T* w, const T* b,
                             int64_t N, int64_t C, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (n >= N) return;  // the whole warp: every shuffle below has its 32 lanes
  const int64_t nv = C / VEC;
  const T* xr = x + n * C;
  T* yr = y + n * C;
  Pack<T, VEC> v[S] = {};
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < S; ++k) {
    const int64_t j = lane + 32 * k;
    if (j < nv) {
      v[k] = load_pack<T, VEC>(xr + j * VEC);
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc += load(v[k].e[i]);
    }
  }
  const float m = mean ? warp_sum(acc) / float(C) : 0.f;
  acc = 0.f;
#pragma unroll
  for (int k = 0; k < S; ++k) {
    if (lane + 32 * k < nv) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float d = load(v[k].e[i]) - m;
        acc += d * d;
      }
    }
  }
  const float s = 1.f / sqrtf(warp_sum(acc) / float(C) + eps);
#pragma unroll
  for (int k = 0; k < S; ++k) {
    const int64_t j = lane + 32 * k;
    if (j < nv) {
      const Pack<T, VEC> wv = load_pack<T, VEC>(w + j * VEC);
      Pack<T, VEC> bv = {};
      if (b) bv = load_pack<T, VEC>(b + j * VEC);
      Pack<T, VEC> o;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        float r = (load(v[k].e[i]) - m) * s * load(wv.e[i]);
        if (b) r += load(bv.e[i]);
        o.e[i] = store<T>(r);
      }
      store_pack<T, VEC>(yr + j * VEC, o);
    }
  }
  if (lane == 0) {
    if (mean) mean[n] = m;
    rstd[n] = s;
  }
}

// dx [N, C] += rstd (g - mean(g) - xhat mean(g xhat)), g = dy [N, C] w [C],
// xhat = (x [N, C] - mean [N]) rstd [N]; mean null: RMSNorm (no centring, no
// mean(g) term). pw, pb [gridDim.x, C] <- per block, the sums over its rows of
// dy xhat and of dy (null: not computed). Block b has the rows [b R, b R + R),
// R = kRowWarps * rows_per_warp, its warp i the rows b R + i + kRowWarps q for
// q < rows_per_warp, one at a time: lane l holds the row's vectors l, l + 32, ...
// of x and dy (C a multiple of VEC, S * VEC <= kSlotElemsBwd) and adds its
// columns' dw, db terms in row order; then the warps' sums are added in warp
// order. dx is read and written by the lane that read x and dy there.
template <typename T, int VEC, int S>
__global__ void __launch_bounds__(kRowWarps * 32)
    norm_backward_warp_kernel(T* dx, float* pw, float* pb, const T* dy, const T* x, const T* w,
                              const float* mean, const float* rstd, int64_t N, int64_t C,
                              int64_t rows_per_warp) {
  static_assert(S * VEC <= kSlotElemsBwd, "the lane's dw, db sums stay in registers");
  __shared__ float sw[kParamCols], sb[kParamCols];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t nv = C / VEC;
  float aw[S][VEC] = {}, ab[S][VEC] = {};
  const int64_t r0 = int64_t(blockIdx.x) * kRowWarps * rows_per_warp;
  for (int64_t q = 0; q < rows_per_warp; ++q) {
    const int64_t n = r0 + warp + kRowWarps * q;
    if (n >= N) break;  // the whole warp (later rows are larger)
    const float m = mean ? mean[n] : 0.f, s = rstd[n];
    const T *xr = x + n * C, *dyr = dy + n * C;
    T* dxr = dx + n * C;
    Pack<T, VEC> xv[S] = {}, dv[S] = {};
#pragma unroll
    for (int k = 0; k < S; ++k) {
      const int64_t j = lane + 32 * k;
      if (j < nv) {
        xv[k] = load_pack<T, VEC>(xr + j * VEC);
        dv[k] = load_pack<T, VEC>(dyr + j * VEC);
      }
    }
    float gs = 0.f, gxs = 0.f;
#pragma unroll
    for (int k = 0; k < S; ++k) {
      const int64_t j = lane + 32 * k;
      if (j < nv) {
        const Pack<T, VEC> wv = load_pack<T, VEC>(w + j * VEC);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float g = load(dv[k].e[i]) * load(wv.e[i]);
          gs += g;
          gxs += g * ((load(xv[k].e[i]) - m) * s);
        }
      }
    }
    const float gm = mean ? warp_sum(gs) / float(C) : 0.f;
    const float gxm = warp_sum(gxs) / float(C);
#pragma unroll
    for (int k = 0; k < S; ++k) {
      const int64_t j = lane + 32 * k;
      if (j < nv) {
        const Pack<T, VEC> wv = load_pack<T, VEC>(w + j * VEC);
        const Pack<T, VEC> old = load_pack<T, VEC>(dxr + j * VEC);
        Pack<T, VEC> o;
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float d = load(dv[k].e[i]);
          const float xhat = (load(xv[k].e[i]) - m) * s;
          const float g = d * load(wv.e[i]);
          o.e[i] = store<T>(load(old.e[i]) + s * (g - gm - xhat * gxm));
          aw[k][i] += d * xhat;
          ab[k][i] += d;
        }
        store_pack<T, VEC>(dxr + j * VEC, o);
      }
    }
  }
  if (!pw && !pb) return;  // the whole block
  for (int i = 0; i < kRowWarps; ++i) {
    if (warp == i) {
#pragma unroll
      for (int k = 0; k < S; ++k) {
        const int64_t j = lane + 32 * k;
        if (j < nv) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const int64_t c = j * VEC + e;
            sw[c] = i == 0 ? aw[k][e] : sw[c] + aw[k][e];
            sb[c] = i == 0 ? ab[k][e] : sb[c] + ab[k][e];
          }
        }
      }
    }
    __syncthreads();
  }
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    if (pw) pw[int64_t(blockIdx.x) * C + c] = sw[c];
    if (pb) pb[int64_t(blockIdx.x) * C + c] = sb[c];
  }
}

// y [N, C] <- layernorm(x [N, C]) * w [C] + b [C] (b null: no bias); mean, rstd [N].
// One block per row.
template <typename T>
__global__ void layernorm_forward_kernel(T* y, float* mean, float* rstd, const T* x, const T* w,
                                         const T* b, int64_t C, float eps) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  const T* xr = x + n * C;
  T* yr = y + n * C;
  float acc = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) acc += load(xr[c]);
  const float m = block_sum(acc, shared) / float(C);
  acc = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = load(xr[c]) - m;
    acc += d * d;
  }
  const float s = 1.f / sqrtf(block_sum(acc, shared) / float(C) + eps);
  // Each element is read before it is written, by the same thread: y may be x.
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float v = (load(xr[c]) - m) * s * load(w[c]);
    if (b) v += load(b[c]);
    yr[c] = store<T>(v);
  }
  if (threadIdx.x == 0) {
    mean[n] = m;
    rstd[n] = s;
  }
}

// y [N, C] <- x [N, C] * rstd * w [C]; rstd [N] = 1 / sqrt(mean(x^2) + eps). One block per row.
template <typename T>
__global__ void rmsnorm_forward_kernel(T* y, float* rstd, const T* x, const T* w, int64_t C,
                                       float eps) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  const T* xr = x + n * C;
  T* yr = y + n * C;
  float acc = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = load(xr[c]);
    acc += v * v;
  }
  const float s = 1.f / sqrtf(block_sum(acc, shared) / float(C) + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    yr[c] = store<T>(load(xr[c]) * s * load(w[c]));
  if (threadIdx.x == 0) rstd[n] = s;
}

// dx [N, C] += rstd (g - mean(g) - xhat mean(g xhat)), g = dy [N, C] w [C],
// xhat = (x [N, C] - mean [N]) rstd [N]. mean null: RMSNorm (no centring, no
// mean(g) term). One block per row.
template <typename T>
__global__ void norm_backward_dx_kernel(T* dx, const T* dy, const T* x, const T* w,
                                        const float* mean, const float* rstd, int64_t C) {
  __shared__ float shared_g[32], shared_gx[32];
  const int64_t n = blockIdx.x;
  const T *xr = x + n * C, *dyr = dy + n * C;
  T* dxr = dx + n * C;
  const float m = mean ? mean[n] : 0.f, s = rstd[n];
  float gm = 0.f, gxm = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = load(dyr[c]) * load(w[c]);
    gm += g;
    gxm += g * (load(xr[c]) - m) * s;
  }
  gm = block_sum(gm, shared_g);
  gxm = block_sum(gxm, shared_gx);
  gm = mean ? gm / float(C) : 0.f;
  gxm /= float(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float xhat = (load(xr[c]) - m) * s;
    const float g = load(dyr[c]) * load(w[c]);
    dxr[c] = store<T>(load(dxr[c]) + s * (g - gm - xhat * gxm));
  }
}

// pw, pb [chunks, C] <- per chunk of `chunk` rows: sum_n dy xhat and sum_n dy
// (xhat as above; mean null: RMSNorm). pw or pb null: not computed.
// Block (kTileCols, kTileRows), grid (column tiles, chunks).
template <typename T>
__global__ void norm_param_partials_kernel(float* pw, float* pb, const T* dy, const T* x,
                                           const float* mean, const float* rstd, int64_t N,
                                           int64_t C, int64_t chunk) {
  __shared__ float sw[kTileRows][kTileCols + 1], sb[kTileRows][kTileCols + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = int64_t(blockIdx.x) * kTileCols + tx;
  const int64_t r0 = int64_t(blockIdx.y) * chunk, r1 = r0 + chunk < N ? r0 + chunk : N;
  float aw = 0.f, ab = 0.f;
  if (c < C) {
    for (int64_t r = r0 + ty; r < r1; r += kTileRows) {
      const float d = load(dy[r * C + c]);
      const float m = mean ? mean[r] : 0.f;
      aw += d * (load(x[r * C + c]) - m) * rstd[r];
      ab += d;
    }
  }
  sw[ty][tx] = aw;
  sb[ty][tx] = ab;
  __syncthreads();
  if (ty == 0 && c < C) {
    float w = 0.f, b = 0.f;
    for (int k = 0; k < kTileRows; ++k) {
      w += sw[k][tx];
      b += sb[k][tx];
    }
    const int64_t at = int64_t(blockIdx.y) * C + c;
    if (pw) pw[at] = w;
    if (pb) pb[at] = b;
  }
}

// dw [C] += sum over chunks of pw [chunks, C]; db, pb likewise (dw or db null:
// not computed). A block covers kFinishCols columns: thread (tx, ty) sums the
// chunks ty, ty + kFinishGroups, ... in order, then one thread per column adds
// the groups' sums in group order.
constexpr int kFinishCols = 32, kFinishGroups = 32;
__global__ void norm_param_finish_kernel(float* dw, float* db, const float* pw, const float* pb,
                                         int64_t chunks, int64_t C) {
  __shared__ float sw[kFinishGroups][kFinishCols + 1], sb[kFinishGroups][kFinishCols + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = int64_t(blockIdx.x) * kFinishCols + tx;
  float aw = 0.f, ab = 0.f;
  if (c < C) {
    for (int64_t k = ty; k < chunks; k += kFinishGroups) {
      if (dw) aw += pw[k * C + c];
      if (db) ab += pb[k * C + c];
    }
  }
  sw[ty][tx] = aw;
  sb[ty][tx] = ab;
  __syncthreads();
  if (ty == 0 && c < C) {
    float w = 0.f, b = 0.f;
    for (int k = 0; k < kFinishGroups; ++k) {
      w += sw[k][tx];
      b += sb[k][tx];
    }
    if (dw) dw[c] += w;
    if (db) db[c] += b;
  }
}

float* grad_or_null(const Tensor& g) {
  return g.defined() ? g.data<float>() : nullptr;
}

// VEC for the warp-per-row kernels over rows of C elements at these pointers:
// kVec<T> when C is a multiple of it and every (non-null) pointer is 16-byte
// aligned, else 1.
template <typename T>
bool rows_vectorised(int64_t C, std::initializer_list<const void*> ptrs) {
  if (C % kVec<T> != 0) return false;
  for (const void* p : ptrs)
    if (!vec_aligned<T, kVec<T>>(p)) return false;
  return true;
}

// Calls fn(std::integral_constant<int, VEC>, std::integral_constant<int, S>) for
// the warp-per-row kernels over rows of C elements (S * VEC <= MAX_ELEMS, S <=
// kSlotMax); false when C is too long for them.
template <typename T, int MAX_ELEMS, typename Fn>
bool with_row_shape(int64_t C, bool vectorised, Fn&& fn) {
  auto run = [&](auto vec) {
    constexpr int VEC = decltype(vec)::value;
    constexpr int MAX_S = MAX_ELEMS / VEC < kSlotMax ? MAX_ELEMS / VEC : kSlotMax;
    const int64_t need = (C / VEC + 31) / 32;
    return with_slots<MAX_S>(need, [&](auto slots) { fn(vec, slots); });
  };
  return vectorised ? run(std::integral_constant<int, kVec<T>>{})
                    : run(std::integral_constant<int, 1>{});
}

// The forward; mean null: RMSNorm.
template <typename T>
void norm_forward(const Tensor& y, float* mean, const Tensor& rstd, const Tensor& x,
                  const Tensor& w, const T* b, float eps) {
  const int64_t N = rows_of(x), C = x.dim(-1);
  if (N == 0 || C == 0) return;
  const cudaStream_t st = nk::cuda::stream();
  const bool vec = rows_vectorised<T>(C, {y.raw(), x.raw(), w.raw(), b});
  const bool warp = with_row_shape<T, 32 * kSlotMax>(C, vec, [&](auto v, auto s) {
    constexpr int VEC = decltype(v)::value, S = decltype(s)::value;
    const unsigned blocks = unsigned((N + kRowWarps - 1) / kRowWarps);
    norm_forward_warp_kernel<T, VEC, S><<<blocks, kRowWarps * 32, 0, st>>>(
        y.data<T>(), mean, rstd.data<float>(), x.data<T>(), w.data<T>(), b, N, C, eps);
    NK_CUDA_LAUNCHED("norm_forward_warp_kernel");
  });
  if (warp) return;
  if (mean) {
    layernorm_forward_kernel<T><<<unsigned(N), kThreads, 0, st>>>(
        y.data<T>(), mean, rstd.data<float>(), x.data<T>(), w.data<T>(), b, C, eps);
    NK_CUDA_LAUNCHED("layernorm_forward_kernel");
  } else {
    rmsnorm_forward_kernel<T><<<unsigned(N), kThreads, 0, st>>>(y.data<T>(), rstd.data<float>(),
                                                                x.data<T>(), w.data<T>(), C, eps);
    NK_CUDA_LAUNCHED("rmsnorm_forward_kernel");
  }
}

// dx, and (when dw or db is wanted) the deterministic column sums: one warp
// per row with the partials summed along (C <= kParamCols), else the dx pass
// then the partials kernel. Which path runs depends on C and the pointers'
// alignment alone, never on which gradients are wanted, so dx and each of dw,
// db have the same bits whatever else is computed. mean null: RMSNorm.
template <typename T>
void norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                   const Tensor& x, const Tensor& w, const float* mean, const Tensor& rstd) {
  const int64_t N = rows_of(x), C = x.dim(-1);
  if (N == 0 || C == 0) return;
  const cudaStream_t st = nk::cuda::stream();
  const bool want = dw.defined() || db.defined();
  const bool vec = rows_vectorised<T>(C, {dx.raw(), dy.raw(), x.raw(), w.raw()});
  const int64_t rows_per_warp =
      std::max(kMinWarpRows, (N + kMaxChunks * kRowWarps - 1) / (kMaxChunks * kRowWarps));
  const int64_t block_rows = kRowWarps * rows_per_warp;
  const int64_t warp_chunks = (N + block_rows - 1) / block_rows;
  Tensor pw, pb;
  int64_t chunks = 0;
  const bool warp = with_row_shape<T, kSlotElemsBwd>(C, vec, [&](auto v, auto s) {
    constexpr int VEC = decltype(v)::value, S = decltype(s)::value;
    chunks = warp_chunks;
    if (dw.defined()) pw = Tensor::empty({chunks, C}, DType::F32, Device::CUDA);
    if (db.defined()) pb = Tensor::empty({chunks, C}, DType::F32, Device::CUDA);
    norm_backward_warp_kernel<T, VEC, S><<<unsigned(chunks), kRowWarps * 32, 0, st>>>(
        dx.data<T>(), grad_or_null(pw), grad_or_null(pb), dy.data<T>(), x.data<T>(), w.data<T>(),
        mean, rstd.data<float>(), N, C, rows_per_warp);
    NK_CUDA_LAUNCHED("norm_backward_warp_kernel");
  });
  if (!warp) {
    norm_backward_dx_kernel<T><<<unsigned(N), kThreads, 0, st>>>(
        dx.data<T>(), dy.data<T>(), x.data<T>(), w.data<T>(), mean, rstd.data<float>(), C);
    NK_CUDA_LAUNCHED("norm_backward_dx_kernel");
    if (!want) return;
    const int64_t chunk = std::max<int64_t>(kChunkRows, (N + 65534) / 65535);
    chunks = (N + chunk - 1) / chunk;
    const int64_t tiles = (C + kTileCols - 1) / kTileCols;
    if (dw.defined()) pw = Tensor::empty({chunks, C}, DType::F32, Device::CUDA);
    if (db.defined()) pb = Tensor::empty({chunks, C}, DType::F32, Device::CUDA);
    norm_param_partials_kernel<T>
        <<<dim3(unsigned(tiles), unsigned(chunks)), dim3(kTileCols, kTileRows), 0, st>>>(
            grad_or_null(pw), grad_or_null(pb), dy.data<T>(), x.data<T>(), mean, rstd.data<float>(),
            N, C, chunk);
    NK_CUDA_LAUNCHED("norm_param_partials_kernel");
  }
  if (!want) return;
  const unsigned tiles = unsigned((C + kFinishCols - 1) / kFinishCols);
  norm_param_finish_kernel<<<tiles, dim3(kFinishCols, kFinishGroups), 0, st>>>(
      grad_or_null(dw), grad_or_null(db), grad_or_null(pw), grad_or_null(pb), chunks, C);
  NK_CUDA_LAUNCHED("norm_param_finish_kernel");
}

}  // namespace

void layernorm_forward(Tensor y, Tensor mean, Tensor rstd, const Tensor& x, const Tensor& w,
                       const Tensor& b, float eps) {
  dispatch_float(x.dtype(), "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    norm_forward<T>(y, mean.data<float>(), rstd, x, w, b.defined() ? b.data<T>() : nullptr, eps);
  });
}

void layernorm_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd) {
  dispatch_float(x.dtype(), "layernorm_backward", [&](auto tag) {
    norm_backward<decltype(tag)>(dx, dw, db, dy, x, w, mean.data<float>(), rstd);
  });
}

// (1 + w) RMSNorm (Gemma) runs on the CPU only for now.
void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps,
                     float w_offset) {
  if (w_offset != 0.f)
    fail("rmsnorm_forward: a weight offset ({}, Gemma's 1 + w) is not implemented on CUDA yet",
         w_offset);
  dispatch_float(x.dtype(), "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    norm_forward<T>(y, nullptr, rstd, x, w, nullptr, eps);
  });
}

void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, float w_offset) {
  if (w_offset != 0.f)
    fail("rmsnorm_backward: a weight offset ({}, Gemma's 1 + w) is not implemented on CUDA yet",
         w_offset);
  dispatch_float(x.dtype(), "rmsnorm_backward", [&](auto tag) {
    norm_backward<decltype(tag)>(dx, dw, Tensor(), dy, x, w, nullptr, rstd);
  });
}

}  // namespace nk::ops::cuda
