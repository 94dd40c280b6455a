// LayerNorm and RMSNorm on CUDA (arguments checked by ops/norm.cc): x, y, dx,
// dy T[N,C]; w, b T[C]; mean, rstd f32[N]; dw, db f32[C], accumulated. The
// forward and the dx pass run one block per row, fp32 inside. dw/db are summed
// without float atomics: a [column tiles, row chunks] grid sums each chunk's
// rows in a fixed order into a partial row of an f32 [chunks, C] buffer, then
// a second kernel adds the partials in chunk order into dw/db, so the result
// depends on N and C alone.
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/shapes.h"

namespace nk::ops::cuda {
namespace {

// dw/db partial sums: a block covers kTileCols columns and a chunk of rows,
// kTileRows threads per column walking the chunk's rows in a fixed stride.
constexpr int kTileCols = 32, kTileRows = 8;
constexpr int64_t kChunkRows = 256;  // at least; more when N needs > 65535 chunks

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

// dw [C] += sum over chunks of pw [chunks, C], in chunk order; db, pb likewise.
// dw or db null: not computed.
__global__ void norm_param_finish_kernel(float* dw, float* db, const float* pw, const float* pb,
                                         int64_t chunks, int64_t C) {
  NK_GRID_STRIDE(c, C) {
    if (dw) {
      float s = 0.f;
      for (int64_t k = 0; k < chunks; ++k) s += pw[k * C + c];
      dw[c] += s;
    }
    if (db) {
      float s = 0.f;
      for (int64_t k = 0; k < chunks; ++k) s += pb[k * C + c];
      db[c] += s;
    }
  }
}

float* grad_or_null(const Tensor& g) {
  return g.defined() ? g.data<float>() : nullptr;
}

// The dx pass, then (when dw or db is wanted) the deterministic column sums.
// mean null: RMSNorm.
template <typename T>
void norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                   const Tensor& x, const Tensor& w, const float* mean, const Tensor& rstd) {
  const int64_t N = rows_of(x), C = x.dim(-1);
  if (N == 0 || C == 0) return;
  const cudaStream_t st = nk::cuda::stream();
  norm_backward_dx_kernel<T><<<unsigned(N), kThreads, 0, st>>>(
      dx.data<T>(), dy.data<T>(), x.data<T>(), w.data<T>(), mean, rstd.data<float>(), C);
  NK_CUDA_LAUNCHED("norm_backward_dx_kernel");
  if (!dw.defined() && !db.defined()) return;
  const int64_t chunk = std::max<int64_t>(kChunkRows, (N + 65534) / 65535);
  const int64_t chunks = (N + chunk - 1) / chunk;
  const int64_t tiles = (C + kTileCols - 1) / kTileCols;
  Tensor pw, pb;
  if (dw.defined()) pw = Tensor::empty({chunks, C}, DType::F32, Device::CUDA);
  if (db.defined()) pb = Tensor::empty({chunks, C}, DType::F32, Device::CUDA);
  float* pwp = grad_or_null(pw);
  float* pbp = grad_or_null(pb);
  norm_param_partials_kernel<T>
      <<<dim3(unsigned(tiles), unsigned(chunks)), dim3(kTileCols, kTileRows), 0, st>>>(
          pwp, pbp, dy.data<T>(), x.data<T>(), mean, rstd.data<float>(), N, C, chunk);
  NK_CUDA_LAUNCHED("norm_param_partials_kernel");
  norm_param_finish_kernel<<<blocks_for(C), kThreads, 0, st>>>(grad_or_null(dw), grad_or_null(db),
                                                               pwp, pbp, chunks, C);
  NK_CUDA_LAUNCHED("norm_param_finish_kernel");
}

}  // namespace

void layernorm_forward(Tensor y, Tensor mean, Tensor rstd, const Tensor& x, const Tensor& w,
                       const Tensor& b, float eps) {
  const int64_t N = rows_of(x), C = x.dim(-1);
  if (N == 0 || C == 0) return;
  dispatch_float(x.dtype(), "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    layernorm_forward_kernel<T><<<unsigned(N), kThreads, 0, nk::cuda::stream()>>>(
        y.data<T>(), mean.data<float>(), rstd.data<float>(), x.data<T>(), w.data<T>(),
        b.defined() ? b.data<T>() : nullptr, C, eps);
    NK_CUDA_LAUNCHED("layernorm_forward_kernel");
  });
}

void layernorm_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd) {
  dispatch_float(x.dtype(), "layernorm_backward", [&](auto tag) {
    norm_backward<decltype(tag)>(dx, dw, db, dy, x, w, mean.data<float>(), rstd);
  });
}

void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) {
  const int64_t N = rows_of(x), C = x.dim(-1);
  if (N == 0 || C == 0) return;
  dispatch_float(x.dtype(), "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_forward_kernel<T><<<unsigned(N), kThreads, 0, nk::cuda::stream()>>>(
        y.data<T>(), rstd.data<float>(), x.data<T>(), w.data<T>(), C, eps);
    NK_CUDA_LAUNCHED("rmsnorm_forward_kernel");
  });
}

void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd) {
  dispatch_float(x.dtype(), "rmsnorm_backward", [&](auto tag) {
    norm_backward<decltype(tag)>(dx, dw, Tensor(), dy, x, w, nullptr, rstd);
  });
}

}  // namespace nk::ops::cuda
