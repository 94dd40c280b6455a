// Token + position embedding on CUDA (arguments checked by ops/embedding.cc;
// CPU twin in ops/cpu/embedding.cc): tokens i32[B,T]; wte T[V,C]; wpe
// T[maxT,C]; out T[B,T,C]. Token and position ids read from device memory are
// checked by a kernel first; a bad one makes the other kernels do nothing and
// is reported as the CPU reports it.
//
// The backward is deterministic without float atomics, and sums in the CPU's
// order: the rows n of dout are stably radix-sorted by the gradient row they
// add to (cub), and one thread per (run of equal rows, column vector) adds that run's
// rows in order of n, so every element of dwte (dwpe) gets the same float
// additions, in the same order, as on the CPU.
//
// Rows move VEC columns per thread (16-byte accesses of the table's dtype;
// dwte/dwpe as VEC floats) when C is a multiple of 16 bytes' worth and every
// pointer is aligned for it, else one column per thread.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <climits>
#include <initializer_list>
#include <optional>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"

namespace nk::ops::cuda {
namespace {

// Reports tok i32[n] outside [0, V) (when `shard`: only negative ones) into tok_err,
// and pos i32[n] outside [0, max_t) into pos_err; a null tok or pos is not checked.
__global__ void check_ids_kernel(const int32_t* tok, int64_t V, bool shard, DeviceError tok_err,
                                 const int32_t* pos, int64_t max_t, DeviceError pos_err,
                                 int64_t n) {
  NK_GRID_STRIDE(i, n) {
    if (tok && (tok[i] < 0 || (!shard && tok[i] >= V))) report(tok_err, i, tok[i]);
    if (pos && (pos[i] < 0 || pos[i] >= max_t)) report(pos_err, i, pos[i]);
  }
}

// Whether a check failed: flags of ErrorFlag (nullptr: not checked).
__device__ __forceinline__ bool failed(const int64_t* a, const int64_t* b) {
  return (a && *a != 0) || (b && *b != 0);
}

// out T[N, C] <- wte T[V, C] rows tok[n] - v0 (a zero row outside [0, V): another
// shard's id) + wpe T[maxT, C] rows pos ? pos[n] : n % T (when wpe is given);
// VEC columns per thread and step (C a multiple of VEC)
template <typename T, int VEC>
__global__ void embedding_forward_kernel(T* out, const int32_t* tok, const T* wte, const T* wpe,
                                         const int32_t* pos, int64_t N, int64_t T_, int64_t C,
                                         int64_t V, int64_t v0, const int64_t* bad_tok,
                                         const int64_t* bad_pos) {
  if (failed(bad_tok, bad_pos)) return;
  const int64_t cv = C / VEC;
  NK_GRID_STRIDE(i, N * cv) {
    const int64_t n = i / cv, c = (i - n * cv) * VEC;
    const int64_t id = int64_t(tok[n]) - v0;
    const bool here = id >= 0 && id < V;
    Pack<T, VEC> o;
    if (wpe) {
      const Pack<T, VEC> p = load_pack<T, VEC>(wpe + (pos ? int64_t(pos[n]) : n % T_) * C + c);
      if (here) {
        const Pack<T, VEC> e = load_pack<T, VEC>(wte + id * C + c);
#pragma unroll
        for (int k = 0; k < VEC; ++k) o.e[k] = store<T>(load(e.e[k]) + load(p.e[k]));
      } else {
        o = p;
      }
    } else if (here) {
      o = load_pack<T, VEC>(wte + id * C + c);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) o.e[k] = store<T>(0.f);
    }
    store_pack<T, VEC>(out + n * C + c, o);
  }
}

// keys u32[N] <- the gradient row that row n adds to, ids[n] - v0, or R when it is
// outside [0, R) (adds nothing); rows i32[N] <- n
__global__ void row_keys_kernel(uint32_t* keys, int32_t* rows, const int32_t* ids, int64_t N,
                                int64_t v0, int64_t R) {
  NK_GRID_STRIDE(n, N) {
    const int64_t id = int64_t(ids[n]) - v0;
    keys[n] = uint32_t(id >= 0 && id < R ? id : R);
    rows[n] = int32_t(n);
  }
}

// Rows added per batch of independent loads in the backward's ordered sums.
constexpr int kSumBatch = 4;

// dw f32[R, C] += dout T[N, C] rows, given keys u32[N] sorted (stably) and rows i32[N]
// in that order: the thread of (the first k of a run of equal keys < R, columns
// [c, c + VEC)) adds dout[rows[k], c..], dout[rows[k + 1], c..], ... of its run, in
// order, to dw[key, c..] (C a multiple of VEC). Rows are loaded kSumBatch at a time
// and added in order.
template <typename T, int VEC>
__global__ void scatter_sorted_kernel(float* dw, const T* dout, const uint32_t* keys,
                                      const int32_t* rows, int64_t N, int64_t C, uint32_t R,
                                      const int64_t* bad_a, const int64_t* bad_b) {
  if (failed(bad_a, bad_b)) return;
  const int64_t cv = C / VEC;
  NK_GRID_STRIDE(i, N * cv) {
    const int64_t k = i / cv, c = (i - k * cv) * VEC;
    const uint32_t key = keys[k];
    if (key >= R || (k > 0 && keys[k - 1] == key)) continue;
    int64_t end = k + 1;  // the run is [k, end)
    while (end < N && keys[end] == key) ++end;
    float* g = dw + int64_t(key) * C + c;
    float acc[VEC];
    load_vec<float, VEC>(acc, g);
    int64_t j = k;
    for (; j + kSumBatch <= end; j += kSumBatch) {
      float d[kSumBatch][VEC];
#pragma unroll
      for (int b = 0; b < kSumBatch; ++b)
        load_vec<T, VEC>(d[b], dout + int64_t(rows[j + b]) * C + c);
#pragma unroll
      for (int b = 0; b < kSumBatch; ++b)
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] += d[b][e];
    }
    for (; j < end; ++j) {
      float d[VEC];
      load_vec<T, VEC>(d, dout + int64_t(rows[j]) * C + c);
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] += d[e];
    }
    store_vec<float, VEC>(g, acc);
  }
}

// dwpe f32[T, C] += dout T[B, T, C] summed over b in order; VEC columns per thread
// and step (C a multiple of VEC), kSumBatch rows loaded at a time
template <typename T, int VEC>
__global__ void position_grad_kernel(float* dwpe, const T* dout, int64_t B, int64_t T_, int64_t C,
                                     const int64_t* bad_a, const int64_t* bad_b) {
  if (failed(bad_a, bad_b)) return;
  const int64_t TC = T_ * C;
  NK_GRID_STRIDE(i, TC / VEC) {
    float acc[VEC];
    load_vec<float, VEC>(acc, dwpe + i * VEC);
    int64_t b = 0;
    for (; b + kSumBatch <= B; b += kSumBatch) {
      float d[kSumBatch][VEC];
#pragma unroll
      for (int u = 0; u < kSumBatch; ++u) load_vec<T, VEC>(d[u], dout + (b + u) * TC + i * VEC);
#pragma unroll
      for (int u = 0; u < kSumBatch; ++u)
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] += d[u][e];
    }
    for (; b < B; ++b) {
      float d[VEC];
      load_vec<T, VEC>(d, dout + b * TC + i * VEC);
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] += d[e];
    }
    store_vec<float, VEC>(dwpe + i * VEC, acc);
  }
}

// Whether rows of C elements of the table dtype T (and of the f32 gradient `grad`)
// may move kVec<T> columns at a time through all of `ptrs` (T) and grad (f32).
template <typename T>
bool rows_vectorised(int64_t C, std::initializer_list<const void*> ptrs, const float* grad) {
  constexpr int V = kVec<T>;
  if (C % V != 0 || !vec_aligned<float, V>(grad)) return false;
  for (const void* p : ptrs)
    if (!vec_aligned<T, V>(p)) return false;
  return true;
}

// dw f32[R, C] += dout T[N, C] row n into row ids[n] - v0 (ids outside [v0, v0 + R) add
// nothing), each element summing its rows in order of n: a stable sort of the rows
// by key, then scatter_sorted_kernel.
template <typename T>
void scatter_rows(float* dw, int64_t R, const T* dout, const int32_t* ids, int64_t v0, int64_t N,
                  int64_t C, const int64_t* bad_a, const int64_t* bad_b) {
  NK_CHECK(N <= INT_MAX && R < int64_t(UINT32_MAX), "embedding_backward: {} rows into {}", N, R);
  const cudaStream_t stream = nk::cuda::stream();
  auto i32 = [&] { return Tensor::empty({N}, DType::I32, Device::CUDA); };
  Tensor keys_in = i32(), keys_out = i32(), rows_in = i32(), rows_out = i32();
  auto* ki = static_cast<uint32_t*>(keys_in.raw());
  auto* ko = static_cast<uint32_t*>(keys_out.raw());
  auto* ri = static_cast<int32_t*>(rows_in.raw());
  auto* ro = static_cast<int32_t*>(rows_out.raw());
  row_keys_kernel<<<blocks_for(N), kThreads, 0, stream>>>(ki, ri, ids, N, v0, R);
  NK_CUDA_LAUNCHED("row_keys_kernel");
  int end_bit = 1;  // keys are in [0, R]
  while (end_bit < 32 && (int64_t(1) << end_bit) <= R) ++end_bit;
  size_t temp_bytes = 0;
  NK_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ki, ko, ri, ro, int(N), 0,
                                                end_bit, stream));
  Tensor temp = Tensor::empty({int64_t(std::max<size_t>(temp_bytes, 1))}, DType::U8, Device::CUDA);
  NK_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw(), temp_bytes, ki, ko, ri, ro, int(N), 0,
                                                end_bit, stream));
  if (C == 0) return;
  constexpr int V = kVec<T>;
  if (rows_vectorised<T>(C, {dout}, dw))
    scatter_sorted_kernel<T, V><<<blocks_for(N * (C / V)), kThreads, 0, stream>>>(
        dw, dout, ko, ro, N, C, uint32_t(R), bad_a, bad_b);
  else
    scatter_sorted_kernel<T, 1><<<blocks_for(N * C), kThreads, 0, stream>>>(
        dw, dout, ko, ro, N, C, uint32_t(R), bad_a, bad_b);
  NK_CUDA_LAUNCHED("scatter_sorted_kernel");
}

const int64_t* flag_of(const std::optional<ErrorFlag>& f) {
  return f ? f->device().flag : nullptr;
}

DeviceError error_of(const std::optional<ErrorFlag>& f) {
  return f ? f->device() : DeviceError{nullptr};
}

}  // namespace

void embedding_forward(Tensor out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& positions, int64_t vocab_start) {
  const int64_t B = tokens.dim(0), T_ = tokens.dim(1), N = B * T_, C = wte.dim(1), V = wte.dim(0),
                v0 = std::max<int64_t>(vocab_start, 0);
  if (N == 0) return;
  const cudaStream_t stream = nk::cuda::stream();
  // Token ids come from data files: a bad one is the user's error, not ours (a
  // shard sees ids of the whole vocabulary: only negative ones are wrong).
  // Explicit positions matter (and are checked) only with a position table.
  const int32_t* tok = tokens.data<int32_t>();
  const int32_t* pos = wpe.defined() && positions.defined() ? positions.data<int32_t>() : nullptr;
  const int64_t max_t = wpe.defined() ? wpe.dim(0) : 0;
  std::optional<ErrorFlag> tok_err, pos_err;
  tok_err.emplace();
  if (pos) pos_err.emplace();
  check_ids_kernel<<<blocks_for(N), kThreads, 0, stream>>>(
      tok, V, vocab_start >= 0, error_of(tok_err), pos, max_t, error_of(pos_err), N);
  NK_CUDA_LAUNCHED("check_ids_kernel");
  if (C > 0) {
    dispatch_float(wte.dtype(), "embedding_forward", [&](auto tag) {
      using T = decltype(tag);
      constexpr int VEC = kVec<T>;
      const T* wp = wpe.defined() ? wpe.data<T>() : nullptr;
      if (rows_vectorised<T>(C, {out.raw(), wte.raw(), wp}, nullptr))
        embedding_forward_kernel<T, VEC><<<blocks_for(N * (C / VEC)), kThreads, 0, stream>>>(
            out.data<T>(), tok, wte.data<T>(), wp, pos, N, T_, C, V, v0, flag_of(tok_err),
            flag_of(pos_err));
      else
        embedding_forward_kernel<T, 1><<<blocks_for(N * C), kThreads, 0, stream>>>(
            out.data<T>(), tok, wte.data<T>(), wp, pos, N, T_, C, V, v0, flag_of(tok_err),
            flag_of(pos_err));
      NK_CUDA_LAUNCHED("embedding_forward_kernel");
    });
  }
  if (const auto [n, id] = tok_err->read(); n >= 0)  // waits for the kernels
    fail(
        "embedding: token id {} at position {} (batch {}, t {}) is outside the vocabulary "
        "[0, {})",
        id, n, n / T_, n % T_, V);
  if (!pos_err) return;
  if (const auto [n, p] = pos_err->read(); n >= 0)
    fail("{}: position id {} at (batch {}, t {}) is outside [0, max_seq_len = {})",
         "embedding_forward", p, n / T_, n % T_, max_t);
}

void embedding_backward(Tensor dwte, Tensor dwpe, const Tensor& dout, const Tensor& tokens,
                        const Tensor& positions, int64_t vocab_start) {
  const int64_t B = tokens.dim(0), T_ = tokens.dim(1), N = B * T_, C = dout.dim(2),
                v0 = std::max<int64_t>(vocab_start, 0);
  // V is only known (and only needed, to index dwte) when dwte is computed.
  const int64_t V = dwte.defined() ? dwte.dim(0) : 0;
  if (N == 0) return;
  const cudaStream_t stream = nk::cuda::stream();
  const int32_t* tok = tokens.data<int32_t>();
  const int32_t* pos = dwpe.defined() && positions.defined() ? positions.data<int32_t>() : nullptr;
  const int64_t max_t = dwpe.defined() ? dwpe.dim(0) : 0;
  // Checked as on the CPU: every id when the whole vocabulary's dwte is
  // computed, and explicit positions when dwpe is.
  const bool check_tok = dwte.defined() && vocab_start < 0;
  std::optional<ErrorFlag> tok_err, pos_err;
  if (check_tok) tok_err.emplace();
  if (pos) pos_err.emplace();
  if (check_tok || pos) {
    check_ids_kernel<<<blocks_for(N), kThreads, 0, stream>>>(
        check_tok ? tok : nullptr, V, false, error_of(tok_err), pos, max_t, error_of(pos_err), N);
    NK_CUDA_LAUNCHED("check_ids_kernel");
  }
  const int64_t *bad_tok = flag_of(tok_err), *bad_pos = flag_of(pos_err);
  dispatch_float(dout.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* d = dout.data<T>();
    if (dwte.defined()) scatter_rows(dwte.data<float>(), V, d, tok, v0, N, C, bad_tok, bad_pos);
    if (!dwpe.defined()) return;
    if (pos) {
      scatter_rows(dwpe.data<float>(), max_t, d, pos, 0, N, C, bad_tok, bad_pos);
    } else if (T_ * C > 0) {
      constexpr int VEC = kVec<T>;
      float* gp = dwpe.data<float>();
      if (rows_vectorised<T>(C, {d}, gp))
        position_grad_kernel<T, VEC>
            <<<blocks_for(T_ * C / VEC), kThreads, 0, stream>>>(gp, d, B, T_, C, bad_tok, bad_pos);
      else
        position_grad_kernel<T, 1>
            <<<blocks_for(T_ * C), kThreads, 0, stream>>>(gp, d, B, T_, C, bad_tok, bad_pos);
      NK_CUDA_LAUNCHED("position_grad_kernel");
    }
  });
  if (tok_err) {
    const auto [n, id] = tok_err->read();  // waits for the kernels
    NK_CHECK(n < 0, "embedding_backward: token {} at {} outside [0, {})", id, n, V);
  }
  if (pos_err) {
    if (const auto [n, p] = pos_err->read(); n >= 0)
      fail("{}: position id {} at (batch {}, t {}) is outside [0, max_seq_len = {})",
           "embedding_backward", p, n / T_, n % T_, max_t);
  }
}

}  // namespace nk::ops::cuda
