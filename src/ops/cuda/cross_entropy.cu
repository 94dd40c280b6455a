// Softmax cross-entropy on CUDA (arguments checked by ops/cross_entropy.cc):
// logits T[N,V] (f32, bf16), targets i32[N], losses f32[N]. The targets are
// validated first by one block that finds the lowest bad row (the CPU's
// error, and nothing written). Then kBlocksPerSm blocks per multiprocessor
// walk the rows, one row per block at a time: each thread folds its share of
// the row's logits into a running (max, sum of exp) (16-byte loads for the
// whole vectors of the row, the few elements before its first 16-byte
// boundary and after its last one singly), the block combines them into the
// log-sum-exp, and for forward_backward a second pass over the row writes
// dlogits. With few rows in flight at once, the second pass finds the row in
// L2, so the logits come from memory about once. Every element is read before
// the same thread writes it, so dlogits may alias logits.
#include <algorithm>
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

constexpr int kCeThreads = 512, kBlocksPerSm = 2;
constexpr int kUnroll = 4;  // vectors each thread loads before using them
constexpr float kLog2e = 1.4426950408889634f;

// e^v as 2^(v log2 e)
__device__ __forceinline__ float exp_of(float v) {
  return exp2f(v * kLog2e);
}

// Folds K logits v into the running (m, s): m = the max so far, s = the sum of
// e^(x - m) over the logits so far. -inf logits add nothing; NaN ones make s NaN
// (fmaxf passes over them, so m may stay -inf while every logit so far is -inf
// or NaN: s is then 0, or NaN).
template <int K>
__device__ __forceinline__ void fold(float& m, float& s, const float (&v)[K]) {
  float vm = v[0];
#pragma unroll
  for (int i = 1; i < K; ++i) vm = fmaxf(vm, v[i]);
  if (vm > m) {
    s *= exp_of(m - vm);  // m = -inf: s is 0 (or NaN), the factor 0
    m = vm;
  }
  if (m == -INFINITY) {  // these are -inf or NaN
#pragma unroll
    for (int i = 0; i < K; ++i)
      if (v[i] != -INFINITY) s += v[i];
    return;
  }
#pragma unroll
  for (int i = 0; i < K; ++i) s += exp_of(v[i] - m);
}

// fn(k, pack) for this thread's vectors k = threadIdx.x, + blockDim.x, ... < nvec of
// p [nvec * VEC], kUnroll packs loaded before the first of them is used; each
// pack is read before fn may write its place.
template <typename T, int VEC, typename Fn>
__device__ __forceinline__ void each_vector(const T* p, int64_t nvec, Fn&& fn) {
  const int64_t step = blockDim.x;
  int64_t k = threadIdx.x;
  for (; k + (kUnroll - 1) * step < nvec; k += kUnroll * step) {
    Pack<T, VEC> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_pack<T, VEC>(p + (k + u * step) * VEC);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) fn(k + u * step, v[u]);
  }
  for (; k < nvec; k += step) fn(k, load_pack<T, VEC>(p + k * VEC));
}

// losses [N] <- logsumexp(logits [N, V]) - logits[target]; dlogits [N, V] (null:
// loss only; may be logits) <- (softmax - onehot(target)) * g. Rows whose
// target [N] is ignore get loss 0 and a zero gradient row. Targets checked.
// Block b takes the rows b, b + gridDim.x, ...; a row [0, V) is split at its
// 16-byte boundaries into a head of fewer than VEC elements, whole vectors of
// VEC and a tail of fewer than VEC (VEC = 1: all vectors of one). dlogits, when
// given, lies at the same offset from a 16-byte boundary as logits.
template <typename T, int VEC>
__global__ void __launch_bounds__(kCeThreads, kBlocksPerSm)
    cross_entropy_kernel(float* losses, T* dlogits, const T* logits, const int32_t* targets,
                         int64_t N, int64_t V, int64_t ignore, float g) {
  __shared__ float shared[32];
  const int64_t tid = threadIdx.x;
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const T* x = logits + r * V;
    T* d = dlogits ? dlogits + r * V : nullptr;
    const int64_t misalign = int64_t(reinterpret_cast<uintptr_t>(x) / sizeof(T)) & (VEC - 1);
    const int64_t head = misalign == 0 ? 0 : std::min<int64_t>(V, VEC - misalign);
    const int64_t nvec = (V - head) / VEC, tail = head + nvec * VEC;
    const int64_t t = targets[r];  // the same for every thread: branches on it are the block's
    if (t == ignore) {
      if (tid == 0) losses[r] = 0.f;
      if (!d) continue;
      if (tid < head) d[tid] = store<T>(0.f);
      if (tail + tid < V) d[tail + tid] = store<T>(0.f);
      Pack<T, VEC> zero;
#pragma unroll
      for (int i = 0; i < VEC; ++i) zero.e[i] = store<T>(0.f);
      for (int64_t k = tid; k < nvec; k += blockDim.x) store_pack<T, VEC>(d + head + k * VEC, zero);
      continue;
    }
    // Read before any thread of the block may overwrite it through dlogits (after the
    // barriers of the reductions below).
    const float xt = tid == 0 ? load(x[t]) : 0.f;
    float m = -INFINITY, s = 0.f;
    if (tid < head) {
      const float v[1] = {load(x[tid])};
      fold(m, s, v);
    }
    if (tail + tid < V) {
      const float v[1] = {load(x[tail + tid])};
      fold(m, s, v);
    }
    each_vector<T, VEC>(x + head, nvec, [&](int64_t, const Pack<T, VEC>& p) {
      float v[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = load(p.e[i]);
      fold(m, s, v);
    });
    const float bm = block_max(m, shared);
    // A thread whose m is -inf has only -inf (s = 0) or NaN (s NaN) logits.
    const float part = m == -INFINITY ? s : s * exp_of(m - bm);
    const float lse = bm + logf(block_sum(part, shared));
    if (tid == 0) losses[r] = lse - xt;
    if (!d) continue;
    // (e^(v - lse) - [j == t]) g for the element j holding v
    auto grad = [&](float v, int64_t j) { return (exp_of(v - lse) - (j == t ? 1.f : 0.f)) * g; };
    if (tid < head) d[tid] = store<T>(grad(load(x[tid]), tid));
    if (tail + tid < V) d[tail + tid] = store<T>(grad(load(x[tail + tid]), tail + tid));
    T* dv = d + head;
    const int64_t tv = t - head;  // the target's place among the vectors' elements
    each_vector<T, VEC>(x + head, nvec, [&](int64_t k, const Pack<T, VEC>& p) {
      float o[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) o[i] = exp_of(load(p.e[i]) - lse);
      if (tv >= k * VEC && tv < (k + 1) * VEC) {
#pragma unroll
        for (int i = 0; i < VEC; ++i)
          if (k * VEC + i == tv) o[i] -= 1.f;
      }
#pragma unroll
      for (int i = 0; i < VEC; ++i) o[i] *= g;
      store_vec<T, VEC>(dv + k * VEC, o);
    });
  }
}

// dlogits null: the loss alone.
void run(const Tensor& losses, const Tensor* dlogits, const Tensor& logits, const Tensor& targets,
         int64_t ignore_index, float g) {
  const int64_t V = logits.dim(-1), N = logits.numel() / V;
  if (N == 0) return;
  check_targets(targets, N, V, ignore_index);
  const unsigned blocks = unsigned(std::min<int64_t>(N, int64_t(kBlocksPerSm) * sm_count()));
  dispatch_float(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    constexpr int VEC = kVec<T>;
    T* d = dlogits ? dlogits->data<T>() : nullptr;
    // Vectors in both need the rows of dlogits as far from 16-byte boundaries as logits'.
    const bool vec =
        !d ||
        (reinterpret_cast<uintptr_t>(d) - reinterpret_cast<uintptr_t>(logits.data<T>())) % 16 == 0;
    if (vec)
      cross_entropy_kernel<T, VEC><<<blocks, kCeThreads, 0, nk::cuda::stream()>>>(
          losses.data<float>(), d, logits.data<T>(), targets.data<int32_t>(), N, V, ignore_index,
          g);
    else
      cross_entropy_kernel<T, 1><<<blocks, kCeThreads, 0, nk::cuda::stream()>>>(
          losses.data<float>(), d, logits.data<T>(), targets.data<int32_t>(), N, V, ignore_index,
          g);
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
