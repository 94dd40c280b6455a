// Vocabulary-parallel cross-entropy on CUDA (arguments checked by
// ops/cross_entropy_shard.cc): logits T[N,Vs] (f32, bf16) of one vocabulary
// shard starting at id vocab_start, targets i32[N] (global ids), per-row
// statistics f32[N]. The row passes (stats, backward) run one block per row;
// the per-row combines (rescale, finish) are elementwise. As on the CPU,
// targets outside the shard simply contribute nothing here.
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"

namespace nk::ops::cuda {
namespace {

// row_max, sumexp, target_logit [N] <- per row of logits [N, Vs]: the max,
// sum of exp(x - max), and x[target - v0] (0 when outside the shard). One
// block per row.
template <typename T>
__global__ void shard_stats_kernel(float* mx, float* se, float* tl, const T* logits,
                                   const int32_t* targets, int64_t vs, int64_t v0) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const T* x = logits + r * vs;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < vs; j += blockDim.x) m = fmaxf(m, load(x[j]));
  m = block_max(m, shared);
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < vs; j += blockDim.x) s += expf(load(x[j]) - m);
  s = block_sum(s, shared);
  if (threadIdx.x == 0) {
    const int64_t t = int64_t(targets[r]) - v0;
    mx[r] = m;
    se[r] = s;
    tl[r] = t >= 0 && t < vs ? load(x[t]) : 0.f;
  }
}

// sumexp [N] *= exp(row_max [N] - global_max [N]); row_max = global_max.
__global__ void rescale_stats_kernel(float* mx, float* se, const float* gm, int64_t n) {
  NK_GRID_STRIDE(r, n) {
    const float g = gm[r];
    se[r] *= expf(mx[r] - g);
    mx[r] = g;
  }
}

// lse [N] = row_max + log(sumexp), losses [N] = lse - target_logit; both 0
// where targets [N] == ignore.
__global__ void shard_finish_kernel(float* losses, float* lse, const float* mx, const float* se,
                                    const float* tl, const int32_t* targets, int64_t ignore,
                                    int64_t n) {
  NK_GRID_STRIDE(r, n) {
    const bool skip = targets[r] == ignore;
    const float z = skip ? 0.f : mx[r] + logf(se[r]);
    lse[r] = z;
    losses[r] = skip ? 0.f : z - tl[r];
  }
}

// dlogits [N, Vs] (may be logits) <- (exp(logits [N, Vs] - lse [N]) -
// onehot(target - v0)) * g; zero rows where targets [N] == ignore. One block
// per row; each element is read before the same thread writes it.
template <typename T>
__global__ void shard_backward_kernel(T* dlogits, const T* logits, const int32_t* targets,
                                      const float* lse, int64_t vs, int64_t v0, int64_t ignore,
                                      float g) {
  const int64_t r = blockIdx.x;
  const T* x = logits + r * vs;
  T* d = dlogits + r * vs;
  const bool skip = targets[r] == ignore;
  const int64_t t = int64_t(targets[r]) - v0;
  const float z = lse[r];
  for (int64_t j = threadIdx.x; j < vs; j += blockDim.x) {
    const float p = skip ? 0.f : (expf(load(x[j]) - z) - (j == t ? 1.f : 0.f)) * g;
    d[j] = store<T>(p);
  }
}

}  // namespace

void cross_entropy_shard_stats(Tensor row_max, Tensor sumexp, Tensor target_logit,
                               const Tensor& logits, const Tensor& targets, int64_t vocab_start) {
  const int64_t n = logits.dim(0), vs = logits.dim(1);
  if (n == 0) return;
  dispatch_float(logits.dtype(), "cross_entropy_shard_stats", [&](auto tag) {
    using T = decltype(tag);
    shard_stats_kernel<T><<<unsigned(n), kThreads, 0, nk::cuda::stream()>>>(
        row_max.data<float>(), sumexp.data<float>(), target_logit.data<float>(), logits.data<T>(),
        targets.data<int32_t>(), vs, vocab_start);
    NK_CUDA_LAUNCHED("shard_stats_kernel");
  });
}

void cross_entropy_rescale_stats(Tensor row_max, Tensor sumexp, const Tensor& global_max) {
  const int64_t n = row_max.numel();
  if (n == 0) return;
  rescale_stats_kernel<<<blocks_for(n), kThreads, 0, nk::cuda::stream()>>>(
      row_max.data<float>(), sumexp.data<float>(), global_max.data<float>(), n);
  NK_CUDA_LAUNCHED("rescale_stats_kernel");
}

void cross_entropy_shard_finish(Tensor losses, Tensor lse, const Tensor& row_max,
                                const Tensor& sumexp, const Tensor& target_logit,
                                const Tensor& targets, int64_t ignore_index) {
  const int64_t n = targets.numel();
  if (n == 0) return;
  shard_finish_kernel<<<blocks_for(n), kThreads, 0, nk::cuda::stream()>>>(
      losses.data<float>(), lse.data<float>(), row_max.data<float>(), sumexp.data<float>(),
      target_logit.data<float>(), targets.data<int32_t>(), ignore_index, n);
  NK_CUDA_LAUNCHED("shard_finish_kernel");
}

void cross_entropy_shard_backward(Tensor dlogits, const Tensor& logits, const Tensor& targets,
                                  const Tensor& lse, int64_t vocab_start, int64_t ignore_index,
                                  float grad_scale) {
  const int64_t n = logits.dim(0), vs = logits.dim(1);
  if (n == 0) return;
  dispatch_float(logits.dtype(), "cross_entropy_shard_backward", [&](auto tag) {
    using T = decltype(tag);
    shard_backward_kernel<T><<<unsigned(n), kThreads, 0, nk::cuda::stream()>>>(
        dlogits.data<T>(), logits.data<T>(), targets.data<int32_t>(), lse.data<float>(), vs,
        vocab_start, ignore_index, grad_scale);
    NK_CUDA_LAUNCHED("shard_backward_kernel");
  });
}

}  // namespace nk::ops::cuda
