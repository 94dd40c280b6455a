// Attention of new tokens over a paged KV cache on CUDA (decode and ragged
// prefill; arguments checked by ops/kv_attention.cc): qkv T[N,(Hq+2*Hkv)*D];
// k_cache, v_cache C[NB,Hkv,B,D]; block_table i32[Q,M]; seqs, positions i32[N];
// out T[N,Hq*D]. T is f32 or bf16, C (the cache's) f32, bf16 or f16, fp32
// inside. Head dims up to 256.
//
// Validation: the tokens' sequences, positions and every block they read come
// from the scheduler, so both ops check them on the device first, as the CPU
// kernel does: one thread per token checks its sequence and position and
// raises its sequence's block count (an integer atomicMax), then one thread per
// block-table entry checks the blocks in use. A failure (read back through
// ErrorFlag, one small synchronising copy) is reported with the CPU kernel's
// text for the first bad token, found on the host from copies of the inputs.
//
// kv_cache_store: one thread per (token, kv head, column), a copy rounded to C.
//
// attention_cached: one block of 4 warps per (token, kv head, chunk of 16
// query heads of its group), each warp owning 4 query heads. The token's
// visible positions stream through shared memory in tiles of 32 (k and v rows
// gathered through the block table, converted to fp32), shared by the chunk's
// heads; per head a lane scores one position of the tile and the head keeps
// an online softmax (fp32 running max and sum) and its output in registers.
// Tiles sit at multiples of 32 positions whatever the block size, so a paged
// cache gives the contiguous cache's bits.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/shapes.h"

namespace nk::ops::cuda {
namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kWarps = 4;                  // warps per block
constexpr int kRows = 4;                   // query heads per warp
constexpr int kHeadTile = kWarps * kRows;  // query heads per block: 16
constexpr int kPosTile = 32;               // positions per tile, one per lane
constexpr size_t kDefaultSmem = 48 * 1024;

struct CacheDims {
  int64_t N;  // new tokens
  int Hq, Hkv, D;
  int64_t NB, B;  // blocks, positions per block
  int64_t Q, M;   // block table [Q, M]
};

CacheDims dims_of(const Tensor& qkv, const Tensor& k_cache, int64_t hq, const Tensor& table) {
  return {rows_of(qkv),   int(hq),        int(k_cache.dim(1)), int(k_cache.dim(3)),
          k_cache.dim(0), k_cache.dim(2), table.dim(0),        table.dim(1)};
}

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}
__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) {
  return a > b ? a : b;
}

// fn(T{}, C{}) for the dtypes the ops accept: compute T f32 or bf16, cache C
// f32, bf16 or f16.
template <typename Fn>
void dispatch_kv(DType dt, DType cache, const char* op, Fn&& fn) {
  auto with_t = [&](auto c) {
    if (dt == DType::F32)
      fn(float{}, c);
    else if (dt == DType::BF16)
      fn(bf16{}, c);
    else
      NK_CHECK(false, "{}: unsupported dtype {}", op, dtype_name(dt));
  };
  if (cache == DType::F32)
    with_t(float{});
  else if (cache == DType::BF16)
    with_t(bf16{});
  else if (cache == DType::F16)
    with_t(f16{});
  else
    NK_CHECK(false, "{}: unsupported cache dtype {}", op, dtype_name(cache));
}

// ---- validation ----

// q8_0 caches (u8 rows of Q8_0 blocks) have CPU kernels alone.
void refuse_q8(const Tensor& k_cache, const char* op) {
  if (k_cache.dtype() == DType::U8)
    fail("{}: a q8_0 KV cache has no CUDA kernel yet (kv_cache_dtype=q8_0 runs on the CPU)", op);
}

// Per token n: seqs[n] in [0, Q) and positions[n] in [0, M*B), else a report;
// blocks_used i32[Q] (zeroed) gets the number of table entries sequence
// seqs[n] reads, positions[n]/B + 1, at least.
__global__ void check_tokens_kernel(DeviceError e, int32_t* blocks_used, const int32_t* seqs,
                                    const int32_t* positions, int64_t N, int64_t Q, int64_t M,
                                    int64_t B) {
  NK_GRID_STRIDE(n, N) {
    const int32_t s = seqs[n], p = positions[n];
    if (s < 0 || s >= Q || p < 0 || p >= M * B)
      report(e, n, s);
    else
      atomicMax(blocks_used + s, int32_t(p / B + 1));
  }
}

// Per table entry (q, j) i32[Q, M] with j < blocks_used[q]: a block in [0, NB), else a report.
__global__ void check_blocks_kernel(DeviceError e, const int32_t* table, const int32_t* blocks_used,
                                    int64_t Q, int64_t M, int64_t NB) {
  NK_GRID_STRIDE(i, Q * M) {
    const int32_t blk = table[i];
    if (i % M < blocks_used[i / M] && (blk < 0 || blk >= NB)) report(e, i, blk);
  }
}

std::vector<int32_t> to_host_i32(const Tensor& t) {
  std::vector<int32_t> h(size_t(t.numel()));
  nk::cuda::copy_to_host(h.data(), t.raw(), h.size() * sizeof(int32_t));
  return h;
}

// The CPU kernel's error for the first bad token (inputs copied to the host).
[[noreturn]] void fail_tokens(const char* op, const CacheDims& d, const Tensor& table,
                              const Tensor& seqs, const Tensor& positions) {
  const std::vector<int32_t> tb = to_host_i32(table), sq = to_host_i32(seqs),
                             ps = to_host_i32(positions);
  for (int64_t n = 0; n < d.N; ++n) {
    if (sq[n] < 0 || sq[n] >= d.Q)
      fail("{}: token {} names sequence {}, outside the block table's [0, {})", op, n, sq[n], d.Q);
    if (ps[n] < 0 || ps[n] >= d.M * d.B)
      fail("{}: token {} is at position {}, outside the cache's [0, {})", op, n, ps[n], d.M * d.B);
    for (int64_t j = 0; j <= ps[n] / d.B; ++j) {
      const int32_t blk = tb[size_t(sq[n] * d.M + j)];
      if (blk < 0 || blk >= d.NB)
        fail("{}: token {} (sequence {}, position {}) reads block {}, outside [0, {})", op, n,
             sq[n], ps[n], blk, d.NB);
    }
  }
  fail("{}: the block table, sequences or positions were rejected on the device but read as valid",
       op);
}

// Checks every token's sequence, position and the blocks of its sequence up
// to its position (a synchronising read-back); throws nk::Error naming the
// first bad token.
void validate(const char* op, const CacheDims& d, const Tensor& table, const Tensor& seqs,
              const Tensor& positions) {
  if (d.N == 0) return;
  cudaStream_t st = nk::cuda::stream();
  Tensor used = Tensor::empty({d.Q}, DType::I32, Device::CUDA);
  if (d.Q > 0) nk::cuda::memset_zero(used.raw(), used.nbytes());
  ErrorFlag flag;
  check_tokens_kernel<<<blocks_for(d.N), kThreads, 0, st>>>(
      flag.device(), used.data<int32_t>(), seqs.data<int32_t>(), positions.data<int32_t>(), d.N,
      d.Q, d.M, d.B);
  NK_CUDA_LAUNCHED("check_tokens_kernel");
  check_blocks_kernel<<<blocks_for(d.Q * d.M), kThreads, 0, st>>>(
      flag.device(), table.data<int32_t>(), used.data<int32_t>(), d.Q, d.M, d.NB);
  NK_CUDA_LAUNCHED("check_blocks_kernel");
  if (flag.read().first >= 0) fail_tokens(op, d, table, seqs, positions);
}

// ---- kernels ----

// k_cache, v_cache C[NB,Hkv,B,D] at (block_table[seqs[n], p / B], kvh, p % B),
// p = positions[n] <- the k and v heads of qkv T[N,W]. One thread per (n, kvh, c).
template <typename T, typename Cache>
__global__ void kv_cache_store_kernel(Cache* kc, Cache* vc, const T* qkv, const int32_t* table,
                                      const int32_t* seqs, const int32_t* positions, int64_t N,
                                      int Hq, int Hkv, int D, int64_t B, int64_t M) {
  const int64_t C = int64_t(Hq + 2 * Hkv) * D;
  NK_GRID_STRIDE(i, N * Hkv * D) {
    const int64_t c = i % D, h = i / D % Hkv, n = i / D / Hkv;
    const int64_t p = positions[n];
    const int64_t at = ((int64_t(table[int64_t(seqs[n]) * M + p / B]) * Hkv + h) * B + p % B) * D;
    const T* src = qkv + n * C + (Hq + h) * D + c;
    kc[at + c] = store<Cache>(load(src[0]));
    vc[at + c] = store<Cache>(load(src[int64_t(Hkv) * D]));
  }
}

// out T[N,Hq*D] <- query heads of qkv T[N,C] over k_cache, v_cache
// C[NB,Hkv,B,D] at positions [first, p] of sequence seqs[n], p = positions[n],
// first = max(0, p - window + 1) (window > 0) or 0. grid (N, Hkv, ceil(G/16)),
// block 128: warp w owns heads g0 + w, w+4, w+8, w+12 of the kv head's group.
// Dynamic shared: Q [16, D] (scaled), K [32, ld], V [32, D].
template <typename T, typename Cache, int P>
__global__ void __launch_bounds__(kWarps * 32)
    attention_cached_kernel(T* out, const T* qkv, const Cache* kc, const Cache* vc,
                            const int32_t* table, const int32_t* seqs, const int32_t* positions,
                            int Hq, int Hkv, int D, int64_t B, int64_t M, int64_t window,
                            float scale) {
  extern __shared__ float smem[];
  const int ld = D | 1;  // odd: the per-lane rows of K hit distinct banks
  float* qs = smem;
  float* ks = qs + kHeadTile * D;
  float* vs = ks + kPosTile * ld;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n = blockIdx.x;
  const int kvh = blockIdx.y, G = Hq / Hkv, g0 = blockIdx.z * kHeadTile;
  const int gn = min(kHeadTile, G - g0);
  const int64_t C = int64_t(Hq + 2 * Hkv) * D;
  const int64_t p = positions[n], first = window > 0 ? imax(0, p - window + 1) : 0;
  const int32_t* blocks = table + int64_t(seqs[n]) * M;
  const T* q_row = qkv + n * C + int64_t(kvh * G + g0) * D;

  for (int i = threadIdx.x; i < kHeadTile * D; i += blockDim.x)
    qs[i] = i / D < gn ? scale * load(q_row[i]) : 0.f;
  float o[kRows][P], m[kRows], l[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int e = 0; e < P; ++e) o[i][e] = 0.f;
  }

  for (int64_t k0 = first / kPosTile * kPosTile; k0 <= p; k0 += kPosTile) {
    // Visible positions of the tile, the same for every head: [jlo, jhi).
    const int jlo = int(imax(first, k0) - k0), jhi = int(imin(p + 1, k0 + kPosTile) - k0);
    __syncthreads();  // Q is loaded; the previous tile's readers are done
    for (int i = threadIdx.x; i < kPosTile * D; i += blockDim.x) {
      const int r = i / D, c = i % D;
      float kv = 0.f, vv = 0.f;
      if (r >= jlo && r < jhi) {  // only visible positions: the rest may hold anything
        const int64_t j = k0 + r;
        const int64_t at = ((int64_t(blocks[j / B]) * Hkv + kvh) * B + j % B) * D + c;
        kv = load(kc[at]);
        vv = load(vc[at]);
      }
      ks[r * ld + c] = kv;
      vs[r * D + c] = vv;
    }
    __syncthreads();
    const bool valid = lane >= jlo && lane < jhi;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = warp + kWarps * i;
      if (r >= gn) continue;  // warp-uniform
      float s = -INFINITY;
      if (valid) {
        const float* q = qs + r * D;
        const float* k = ks + lane * ld;
        float acc = 0.f;
        for (int c = 0; c < D; ++c) acc += q[c] * k[c];
        s = acc;
      }
      const float m_new = fmaxf(m[i], warp_max(s));  // finite: jlo < jhi on every tile
      const float corr = expf(m[i] - m_new);         // 0 on the first tile
      const float pr = valid ? expf(s - m_new) : 0.f;
      l[i] = l[i] * corr + warp_sum(pr);
      m[i] = m_new;
#pragma unroll
      for (int e = 0; e < P; ++e) o[i][e] *= corr;
      for (int j = jlo; j < jhi; ++j) {
        const float pj = __shfl_sync(0xffffffffu, pr, j);
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
    if (r >= gn) continue;
    const float inv = 1.f / l[i];
    T* dst = out + n * Hq * D + int64_t(kvh * G + g0 + r) * D;
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const int c = lane + 32 * e;
      if (c < D) dst[c] = store<T>(o[i][e] * inv);
    }
  }
}

}  // namespace

void kv_cache_store(Tensor k_cache, Tensor v_cache, const Tensor& qkv, int64_t n_q_heads,
                    const Tensor& block_table, const Tensor& seqs, const Tensor& positions) {
  refuse_q8(k_cache, "kv_cache_store");
  const CacheDims d = dims_of(qkv, k_cache, n_q_heads, block_table);
  validate("kv_cache_store", d, block_table, seqs, positions);
  if (d.N == 0 || d.D == 0) return;
  const int64_t total = d.N * d.Hkv * d.D;
  dispatch_kv(qkv.dtype(), k_cache.dtype(), "kv_cache_store", [&](auto tag, auto ctag) {
    using T = decltype(tag);
    using Cache = decltype(ctag);
    kv_cache_store_kernel<T, Cache><<<blocks_for(total), kThreads, 0, nk::cuda::stream()>>>(
        k_cache.data<Cache>(), v_cache.data<Cache>(), qkv.data<T>(), block_table.data<int32_t>(),
        seqs.data<int32_t>(), positions.data<int32_t>(), d.N, d.Hq, d.Hkv, d.D, d.B, d.M);
    NK_CUDA_LAUNCHED("kv_cache_store_kernel");
  });
}

void attention_cached(Tensor out, const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                      int64_t n_q_heads, const Tensor& block_table, const Tensor& seqs,
                      const Tensor& positions, int64_t window, float scale_in, float softcap) {
  refuse_q8(k_cache, "attention_cached");
  const CacheDims d = dims_of(qkv, k_cache, n_q_heads, block_table);
  if (softcap > 0.f ||
      (scale_in != 0.f && std::abs(scale_in * std::sqrt(float(d.D)) - 1.f) > 1e-6f))
    fail("attention_cached: scale {} / softcap {} (Gemma's scores) are not implemented on CUDA yet",
         scale_in, softcap);
  if (d.D > kMaxHeadDim)
    fail("attention_cached: head_dim {} is above the CUDA kernel's limit of {}", d.D, kMaxHeadDim);
  validate("attention_cached", d, block_table, seqs, positions);
  if (d.N == 0) return;
  const int G = d.Hq / d.Hkv;
  NK_CHECK(d.N <= int64_t(INT32_MAX) && d.Hkv <= 65535, "attention_cached: N = {}, Hkv = {}", d.N,
           d.Hkv);
  const dim3 grid(unsigned(d.N), unsigned(d.Hkv), unsigned((G + kHeadTile - 1) / kHeadTile));
  const size_t smem =
      sizeof(float) * size_t(kHeadTile * d.D + kPosTile * (d.D | 1) + kPosTile * d.D);
  const float scale = 1.f / std::sqrt(float(d.D));
  dispatch_kv(qkv.dtype(), k_cache.dtype(), "attention_cached", [&](auto tag, auto ctag) {
    using T = decltype(tag);
    using Cache = decltype(ctag);
    auto launch = [&](auto per) {
      constexpr int P = decltype(per)::value;
      if (smem > kDefaultSmem)
        NK_CUDA_CHECK(cudaFuncSetAttribute(attention_cached_kernel<T, Cache, P>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      attention_cached_kernel<T, Cache, P><<<grid, kWarps * 32, smem, nk::cuda::stream()>>>(
          out.data<T>(), qkv.data<T>(), k_cache.data<Cache>(), v_cache.data<Cache>(),
          block_table.data<int32_t>(), seqs.data<int32_t>(), positions.data<int32_t>(), d.Hq, d.Hkv,
          d.D, d.B, d.M, window, scale);
      NK_CUDA_LAUNCHED("attention_cached_kernel");
    };
    if (d.D <= 32)
      launch(std::integral_constant<int, 1>{});
    else if (d.D <= 64)
      launch(std::integral_constant<int, 2>{});
    else if (d.D <= 128)
      launch(std::integral_constant<int, 4>{});
    else
      launch(std::integral_constant<int, 8>{});
  });
}

}  // namespace nk::ops::cuda
