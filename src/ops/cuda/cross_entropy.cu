// Softmax cross-entropy on CUDA (arguments checked by ops/cross_entropy.cc):
// logits T[N,V] (f32, bf16), targets i32[N], losses f32[N]. The targets are
// validated first by one block that finds the lowest bad row (the CPU's
// error, and nothing written), then one block per row folds its logits into a
// running (max, sum of exp) per thread, combines them over the block and, for
// forward_backward, writes dlogits in a second pass over the row; every
// element is read before the same thread writes it, so dlogits may alias
// logits.
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"

namespace nk::ops::cuda {
namespace {

// err <- the lowest row r whose target [N] is neither ignore nor in [0, V),
// with its id. One block.
__global__ void check_targets_kernel(DeviceError err, const int32_t* targets, int64_t N, int64_t V,
                                     int64_t ignore) {
  __shared__ int64_t first[kThreads];
  int64_t mine = INT64_MAX;
  // Rows ascend along each thread's stride: its first bad row is its lowest.
  for (int64_t r = threadIdx.x; r < N; r += blockDim.x) {
    const int64_t t = targets[r];
    if (t != ignore && (t < 0 || t >= V)) {
      mine = r;
      break;
    }
  }
  first[threadIdx.x] = mine;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s && first[threadIdx.x + s] < first[threadIdx.x])
      first[threadIdx.x] = first[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0 && first[0] != INT64_MAX) report(err, first[0], targets[first[0]]);
}

// Throws the CPU's nk::Error for the first target outside [0, V) that is not
// ignore_index (waits for the device).
void check_targets(const Tensor& targets, int64_t N, int64_t V, int64_t ignore_index) {
  ErrorFlag flag;
  check_targets_kernel<<<1, kThreads, 0, nk::cuda::stream()>>>(
      flag.device(), targets.data<int32_t>(), N, V, ignore_index);
  NK_CUDA_LAUNCHED("check_targets_kernel");
  const auto [row, id] = flag.read();
  if (row >= 0)
    fail("cross_entropy: target id {} at row {} is outside the vocabulary [0, {})", id, row, V);
}

// losses [N] <- logsumexp(logits [N, V]) - logits[target]; dlogits [N, V] (null:
// loss only; may be logits) <- (softmax - onehot(target)) * g. Rows whose
// target [N] is ignore get loss 0 and a zero gradient row. Targets checked.
// One block per row.
template <typename T>
__global__ void cross_entropy_kernel(float* losses, T* dlogits, const T* logits,
                                     const int32_t* targets, int64_t V, int64_t ignore, float g) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const int64_t t = targets[r];
  if (t == ignore) {
    if (threadIdx.x == 0) losses[r] = 0.f;
    if (dlogits)
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) dlogits[r * V + j] = store<T>(0.f);
    return;
  }
  const T* x = logits + r * V;
  // Read before any thread of the block may overwrite it through dlogits.
  const float xt = threadIdx.x == 0 ? load(x[t]) : 0.f;
  // Online: s = sum of exp(x - m) over this thread's elements so far.
  float m = -INFINITY, s = 0.f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float v = load(x[j]);
    if (v > m) {
      s = s * expf(m - v) + 1.f;  // m = -inf: s is 0 and exp gives 0
      m = v;
    } else if (v != -INFINITY) {  // -inf adds nothing (and -inf - -inf would be NaN)
      s += expf(v - m);
    }
  }
  const float bm = block_max(m, shared);
  const float part = m == -INFINITY ? 0.f : s * expf(m - bm);
  const float lse = bm + logf(block_sum(part, shared));
  if (threadIdx.x == 0) losses[r] = lse - xt;
  if (!dlogits) return;
  T* d = dlogits + r * V;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
    d[j] = store<T>((expf(load(x[j]) - lse) - (j == t ? 1.f : 0.f)) * g);
}

// dlogits null: the loss alone.
void run(const Tensor& losses, const Tensor* dlogits, const Tensor& logits, const Tensor& targets,
         int64_t ignore_index, float g) {
  const int64_t V = logits.dim(-1), N = logits.numel() / V;
  if (N == 0) return;
  check_targets(targets, N, V, ignore_index);
  dispatch_float(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_kernel<T><<<unsigned(N), kThreads, 0, nk::cuda::stream()>>>(
        losses.data<float>(), dlogits ? dlogits->data<T>() : nullptr, logits.data<T>(),
        targets.data<int32_t>(), V, ignore_index, g);
    NK_CUDA_LAUNCHED("cross_entropy_kernel");
  });
}

}  // namespace

void cross_entropy_forward(Tensor losses, const Tensor& logits, const Tensor& targets,
                           int64_t ignore_index) {
  run(losses, nullptr, logits, targets, ignore_index, 1.f);
}

void cross_entropy_forward_backward(Tensor losses, Tensor dlogits, const Tensor& logits,
                                    const Tensor& targets, int64_t ignore_index, float grad_scale) {
  run(losses, &dlogits, logits, targets, ignore_index, grad_scale);
}

}  // namespace nk::ops::cuda
