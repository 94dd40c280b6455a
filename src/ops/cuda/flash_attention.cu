// Tensor-core causal grouped-query attention for bf16 (FlashAttention-2's
// algorithm), called by attention.cu for head dims 32, 64 and 128. Layouts
// are attention.cu's: qkv bf16[B,T,(Hq+2*Hkv)*D] packs per token [q heads | k
// heads | v heads]; out bf16[B,T,Hq*D]; lse f32[B,Hq,T] (natural log); dqkv
// like qkv. Scores are scaled by 1/sqrt(D).
//
// Every product is mma.sync.m16n8k16 with bf16 operands and fp32
// accumulation; operands reach the registers through ldmatrix from shared
// tiles of rows padded to D + 8 elements (conflict-free), which cp.async
// fills from global memory 16 bytes at a time, the next tile's copy
// overlapping the current tile's arithmetic (two buffers). Fragment layouts
// are the PTX ISA's for m16n8k16: in an accumulator a thread (lane = 4 g + c)
// holds rows g and g + 8, columns 2c and 2c + 1 of each 8-column block, which
// is also the layout of an A operand's register pairs, so a score tile turns
// into the A operand of the next product in registers (FlashAttention's P).
//
// Forward: a block of 4 warps per (query tile of BM = 64 MR rows, query head,
// batch); warp w owns the 16 MR consecutive rows from w * 16 MR. Key tiles of
// BN rows (k and v of the head's kv head) stream through shared memory; per
// tile a warp computes S = Q K^T (fp32), masks it, keeps the online softmax
// (running row max m and per-thread partial sums l, fp32, exp2 with the scale
// folded in), rounds P once to bf16 and accumulates O += P V in fp32. At the
// end O / l is stored in bf16 and lse = scale m + log l.
//
// Backward, deterministic and without atomics (every element of dqkv has one
// writer and a fixed summation order):
//   1. Drow f32[B,Hq,T] = rowsum(dO * O) (flash_drow_kernel).
//   2. dK, dV: a block of 4 warps per (key tile of 64, kv head, batch), warp w
//      owning 16 key rows. For each query head of the group, the query tiles
//      of BMQ rows that see the key tile stream through shared memory (Q, dO,
//      lse, Drow, starts); a warp computes S^T = K Q^T and dP^T = V dO^T,
//      P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - Drow), and accumulates
//      dV += P^T dO and dK += dS^T Q (P and dS rounded once to bf16).
//   3. dQ: the forward's schedule with 16 rows per warp; per key tile S = Q K^T
//      and dP = dO V^T, P and dS recomputed from lse and Drow, dQ += dS K.
//   dK and dQ are scaled by 1/sqrt(D) when written.
//
// Masking: query t sees keys [starts[t], t] (starts from attention.cu, or 0).
// Tiles sit at fixed multiples of their size. A block visits the tiles that
// meet the union of its rows' spans; a warp skips a tile that none of its rows
// sees, computes one that all of its rows see in full without a mask, and
// masks the rest per element. A row's masked scores add exact zeros (its max
// is unchanged, the correction is exactly 1), so its arithmetic depends only
// on the keys it sees: a window >= T or one document per row gives plain
// causal attention's bits.
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/flash_attention.h"

namespace nk::ops::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kBlock = kWarps * 32;  // threads per block
constexpr float kLog2e = 1.4426950408889634f;
constexpr size_t kDefaultSmem = 48 * 1024;

// Tile sizes per head dim (fixed per D, so every call tiles alike): forward
// rows per warp 16 MR and key tile BN; dQ key tile; dK/dV query tile BMQ.
// Chosen so the fp32 accumulators stay in registers without spills
// (ptxas -v: no spill stores for any of them on sm_80 and sm_90a).
template <int D>
struct Tiles;
template <>
struct Tiles<32> {
  static constexpr int kFwdMR = 2, kFwdBN = 64, kDqBN = 32, kDkvBMQ = 64;
};
template <>
struct Tiles<64> {
  static constexpr int kFwdMR = 2, kFwdBN = 64, kDqBN = 64, kDkvBMQ = 64;
};
template <>
struct Tiles<128> {
  static constexpr int kFwdMR = 2, kFwdBN = 32, kDqBN = 32, kDkvBMQ = 32;
};

// ---- PTX wrappers (sm_80 and later) ----

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (src is
// then not read but must still be a valid address).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i,
// and r[i] receives row lane/4, columns 2 (lane%4), +1 of matrix i (of its
// transpose with trans).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// c[16x8] += a[16x16] b[16x8], bf16 operands, fp32 accumulation.
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded (to nearest even) into bf16x2: lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float exp2_approx(float x) {  // 2^x; 2^-inf = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two adjacent bf16 outputs (p 4-byte aligned), rounded as common.cuh's store.
__device__ __forceinline__ void store2(bf16* p, float a, float b) {
  *reinterpret_cast<uint32_t*>(p) =
      uint32_t(store<bf16>(a).bits) | (uint32_t(store<bf16>(b).bits) << 16);
}

// ---- fragments ----

// The A fragment (16x16) of rows r0.. and columns c0.. of a shared tile with
// row stride LD (elements).
template <int LD>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const uint16_t* s, int r0, int c0,
                                       int lane) {
  ldsm_x4(a, smem_addr(s + (r0 + (lane & 15)) * LD + c0 + (lane >> 4) * 8));
}

// B fragments of two 8-column blocks for a product X Y^T, Y a shared tile
// [n][k]: rows n0..n0+15 of Y, columns k0..k0+15. b[0], b[1]: n-block n0;
// b[2], b[3]: n-block n0 + 8.
template <int LD>
__device__ __forceinline__ void load_b_nt(uint32_t (&b)[4], const uint16_t* s, int n0, int k0,
                                          int lane) {
  ldsm_x4(b,
          smem_addr(s + (n0 + (lane & 7) + ((lane >> 4) << 3)) * LD + k0 + ((lane >> 3) & 1) * 8));
}

// B fragments of two 8-column blocks for a product X Y, Y a shared tile
// [k][n]: rows k0..k0+15 of Y, columns n0..n0+15. b[0], b[1]: n-block n0;
// b[2], b[3]: n-block n0 + 8.
template <int LD>
__device__ __forceinline__ void load_b_nn(uint32_t (&b)[4], const uint16_t* s, int k0, int n0,
                                          int lane) {
  ldsm_x4_trans(
      b, smem_addr(s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n0 + (lane >> 4) * 8));
}

// The A fragment of k-step kk (columns 16 kk..16 kk+15) of an accumulator tile
// c[n-block][4], each element rounded to bf16.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4],
                                         const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// Copies rows r0..r0+R-1 of a [rows, stride] bf16 matrix, columns off..off+D-1,
// into a shared tile [R][D + 8] (cp.async, not committed); rows at or past
// `rows` become zeros.
template <int R, int D>
__device__ __forceinline__ void load_rows(uint16_t* s, const bf16* g, int64_t stride, int64_t off,
                                          int r0, int rows) {
  constexpr int kChunks = D / 8, LD = D + 8;
  for (int i = threadIdx.x; i < R * kChunks; i += kBlock) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const bool valid = r0 + r < rows;
    const bf16* src = g + (valid ? int64_t(r0 + r) * stride : 0) + off + c;
    cp_async16(smem_addr(s + r * LD + c), src, valid);
  }
}

// ---- forward ----

// out, lse <- qkv; starts i32[B,T] or null. grid (ceil(T/BM), Hq, B), block
// 128. Dynamic shared: Q [BM][LD], K [2][BN][LD], V [2][BN][LD].
template <int D, int MR, int BN>
__global__ void __launch_bounds__(kBlock)
    flash_fwd_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ qkv,
                     const int32_t* __restrict__ starts, int Tn, int Hq, int Hkv, float scale,
                     float scale_log2) {
  constexpr int LD = D + 8, WR = 16 * MR, BM = kWarps * WR;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* ks = qs + BM * LD;
  uint16_t* vs = ks + 2 * BN * LD;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
  const int h = blockIdx.y, kvh = h / (Hq / Hkv), b = blockIdx.z;
  const int q0 = int(gridDim.x - 1 - blockIdx.x) * BM;  // the longest rows first
  const int64_t C = int64_t(Hq + 2 * Hkv) * D;
  const int64_t koff = int64_t(Hq + kvh) * D, voff = int64_t(Hq + Hkv + kvh) * D;
  const bf16* base = qkv + int64_t(b) * Tn * C;
  const int32_t* st = starts ? starts + int64_t(b) * Tn : nullptr;

  // Key tiles from the one holding the block's first visible key (starts is
  // nondecreasing) to the one holding its last row.
  const int q_last = min(q0 + BM, Tn) - 1;
  const int k_begin = (st ? st[q0] : 0) / BN * BN;
  const int n_tiles = (q_last - k_begin) / BN + 1;

  load_rows<BM, D>(qs, base, C, int64_t(h) * D, q0, Tn);
  load_rows<BN, D>(ks, base, C, koff, k_begin, Tn);
  load_rows<BN, D>(vs, base, C, voff, k_begin, Tn);
  cp_async_commit();

  // This warp's rows wq0..w_last; this thread's rows wq0 + 16 mi + gid + 8 hh,
  // each seeing keys [row_s, row_t] (rows past T see none).
  const int wq0 = q0 + warp * WR;
  const bool active = wq0 < Tn;
  const int w_last = min(wq0 + WR, Tn) - 1;
  const int w_first_key = active && st ? st[wq0] : 0;
  const int w_max_start = active && st ? st[w_last] : 0;
  int row_t[MR][2], row_s[MR][2];
  float o[MR][D / 8][4], m[MR][2], l[MR][2];
#pragma unroll
  for (int mi = 0; mi < MR; ++mi)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int t = wq0 + mi * 16 + gid + 8 * hh;
      row_t[mi][hh] = t;
      row_s[mi][hh] = t < Tn ? (st ? st[t] : 0) : INT_MAX;
      m[mi][hh] = -INFINITY;
      l[mi][hh] = 0.f;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) o[mi][j][2 * hh] = o[mi][j][2 * hh + 1] = 0.f;
    }

  for (int it = 0; it < n_tiles; ++it) {
    const int n0 = k_begin + it * BN;
    if (it + 1 < n_tiles) {  // prefetch into the buffer read by tile it - 1
      const int nb = (it + 1) & 1;
      load_rows<BN, D>(ks + nb * BN * LD, base, C, koff, n0 + BN, Tn);
      load_rows<BN, D>(vs + nb * BN * LD, base, C, voff, n0 + BN, Tn);
    }
    cp_async_commit();
    cp_async_wait<1>();  // Q and tile it have landed (this thread's copies)
    __syncthreads();     // ... and everyone's
    const uint16_t* kb = ks + (it & 1) * BN * LD;
    const uint16_t* vb = vs + (it & 1) * BN * LD;
    // Warp-uniform: does any row of the warp see a key of the tile; do all see all.
    const bool skip = !active || n0 > w_last || n0 + BN - 1 < w_first_key;
    if (!skip) {
      const bool full = n0 + BN - 1 <= wq0 && n0 >= w_max_start && wq0 + WR <= Tn;
      float s[MR][BN / 8][4];
#pragma unroll
      for (int mi = 0; mi < MR; ++mi)
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mi][j][e] = 0.f;
#pragma unroll 2
      for (int kk = 0; kk < D / 16; ++kk) {  // S = Q K^T
        uint32_t a[MR][4];
#pragma unroll
        for (int mi = 0; mi < MR; ++mi) load_a<LD>(a[mi], qs, warp * WR + mi * 16, kk * 16, lane);
#pragma unroll
        for (int nb = 0; nb < BN / 16; ++nb) {
          uint32_t bk[4];
          load_b_nt<LD>(bk, kb, nb * 16, kk * 16, lane);
#pragma unroll
          for (int mi = 0; mi < MR; ++mi) {
            mma(s[mi][2 * nb], a[mi], bk[0], bk[1]);
            mma(s[mi][2 * nb + 1], a[mi], bk[2], bk[3]);
          }
        }
      }
      // Mask, online softmax; s becomes P (unnormalised, fp32).
#pragma unroll
      for (int mi = 0; mi < MR; ++mi)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          float mx = -INFINITY;
#pragma unroll
          for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& x = s[mi][j][2 * hh + e];
              if (!full) {
                const int k = n0 + j * 8 + tig * 2 + e;
                if (k < row_s[mi][hh] || k > row_t[mi][hh]) x = -INFINITY;
              }
              mx = fmaxf(mx, x);
            }
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_old = m[mi][hh], m_new = fmaxf(m_old, mx);
          // A row that has seen nothing yet keeps m = -inf; its p are 0 and
          // so is the correction (o and l are 0). An unchanged max gives 1.
          const float m_use = m_new == -INFINITY ? 0.f : m_new;
          const float corr = m_old == m_use ? 1.f : exp2_approx((m_old - m_use) * scale_log2);
          const float mb = m_use * scale_log2;
          m[mi][hh] = m_new;
          float sum = 0.f;
#pragma unroll
          for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& x = s[mi][j][2 * hh + e];
              x = exp2_approx(fmaf(x, scale_log2, -mb));
              sum += x;
            }
          l[mi][hh] = l[mi][hh] * corr + sum;
#pragma unroll
          for (int j = 0; j < D / 8; ++j) {
            o[mi][j][2 * hh] *= corr;
            o[mi][j][2 * hh + 1] *= corr;
          }
        }
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {  // O += P V (P rounded to bf16)
        uint32_t a[MR][4];
#pragma unroll
        for (int mi = 0; mi < MR; ++mi) acc_to_a(a[mi], s[mi][2 * kk], s[mi][2 * kk + 1]);
#pragma unroll
        for (int db = 0; db < D / 16; ++db) {
          uint32_t bv[4];
          load_b_nn<LD>(bv, vb, kk * 16, db * 16, lane);
#pragma unroll
          for (int mi = 0; mi < MR; ++mi) {
            mma(o[mi][2 * db], a[mi], bv[0], bv[1]);
            mma(o[mi][2 * db + 1], a[mi], bv[2], bv[3]);
          }
        }
      }
    }
    __syncthreads();  // everyone is done with buffer it & 1 before it is refilled
  }

#pragma unroll
  for (int mi = 0; mi < MR; ++mi)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float lt = l[mi][hh];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      const int t = row_t[mi][hh];
      if (!active || t >= Tn) continue;
      const float inv = 1.f / lt;
      bf16* dst = out + (int64_t(b) * Tn + t) * Hq * D + int64_t(h) * D + tig * 2;
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        store2(dst + j * 8, o[mi][j][2 * hh] * inv, o[mi][j][2 * hh + 1] * inv);
      if (tig == 0) lse[(int64_t(b) * Hq + h) * Tn + t] = m[mi][hh] * scale + logf(lt);
    }
}

// ---- backward ----

// drow f32[B,Hq,T] <- rowsum(dout * out) per head; dout, out bf16[B,T,Hq*D].
// D/8 consecutive lanes per row (row r = (b*T + t)*Hq + h), 8 elements each.
template <int D>
__global__ void __launch_bounds__(kBlock)
    flash_drow_kernel(float* __restrict__ drow, const bf16* __restrict__ dout,
                      const bf16* __restrict__ out, int64_t rows, int Tn, int Hq) {
  constexpr int L = D / 8;
  const int64_t n = rows * L, step = int64_t(gridDim.x) * kBlock;
  // Whole warps iterate together (the shuffles need every lane).
  for (int64_t i0 = int64_t(blockIdx.x) * kBlock + (threadIdx.x & ~31); i0 < n; i0 += step) {
    const int64_t i = i0 + (threadIdx.x & 31);
    float acc = 0.f;
    if (i < n) {
      const uint4 g = *reinterpret_cast<const uint4*>(dout + i * 8);
      const uint4 o = *reinterpret_cast<const uint4*>(out + i * 8);
      const uint32_t gw[4] = {g.x, g.y, g.z, g.w}, ow[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        acc += load(bf16{uint16_t(gw[k])}) * load(bf16{uint16_t(ow[k])});
        acc += load(bf16{uint16_t(gw[k] >> 16)}) * load(bf16{uint16_t(ow[k] >> 16)});
      }
    }
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (i < n && i % L == 0) {
      const int64_t r = i / L, hd = r % Hq, bt = r / Hq, t = bt % Tn, bb = bt / Tn;
      drow[(bb * Hq + hd) * Tn + t] = acc;
    }
  }
}

// dq part of dqkv <- dout, qkv, lse, drow; starts i32[B,T] or null. grid
// (ceil(T/64), Hq, B), block 128, warp w owning query rows 16 w..16 w + 15.
// Dynamic shared: Q [64][LD], dO [64][LD], K [2][BN][LD], V [2][BN][LD].
template <int D, int BN>
__global__ void __launch_bounds__(kBlock)
    flash_bwd_dq_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                        const bf16* __restrict__ qkv, const float* __restrict__ lse,
                        const float* __restrict__ drow, const int32_t* __restrict__ starts, int Tn,
                        int Hq, int Hkv, float scale, float scale_log2) {
  constexpr int LD = D + 8, BM = kWarps * 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* dos = qs + BM * LD;
  uint16_t* ks = dos + BM * LD;
  uint16_t* vs = ks + 2 * BN * LD;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
  const int h = blockIdx.y, kvh = h / (Hq / Hkv), b = blockIdx.z;
  const int q0 = int(gridDim.x - 1 - blockIdx.x) * BM;  // the longest rows first
  const int64_t C = int64_t(Hq + 2 * Hkv) * D, OC = int64_t(Hq) * D;
  const int64_t koff = int64_t(Hq + kvh) * D, voff = int64_t(Hq + Hkv + kvh) * D;
  const bf16* base = qkv + int64_t(b) * Tn * C;
  const bf16* dbase = dout + int64_t(b) * Tn * OC;
  const int32_t* st = starts ? starts + int64_t(b) * Tn : nullptr;
  const float* lse_h = lse + (int64_t(b) * Hq + h) * Tn;
  const float* drow_h = drow + (int64_t(b) * Hq + h) * Tn;

  const int q_last = min(q0 + BM, Tn) - 1;
  const int k_begin = (st ? st[q0] : 0) / BN * BN;
  const int n_tiles = (q_last - k_begin) / BN + 1;

  load_rows<BM, D>(qs, base, C, int64_t(h) * D, q0, Tn);
  load_rows<BM, D>(dos, dbase, OC, int64_t(h) * D, q0, Tn);
  load_rows<BN, D>(ks, base, C, koff, k_begin, Tn);
  load_rows<BN, D>(vs, base, C, voff, k_begin, Tn);
  cp_async_commit();

  const int wq0 = q0 + warp * 16;
  const bool active = wq0 < Tn;
  const int w_last = min(wq0 + 16, Tn) - 1;
  const int w_first_key = active && st ? st[wq0] : 0;
  const int w_max_start = active && st ? st[w_last] : 0;
  int row_t[2], row_s[2];
  float row_lse[2], row_dr[2];  // lse in log2 units
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int t = wq0 + gid + 8 * hh;
    const bool in = t < Tn;
    row_t[hh] = t;
    row_s[hh] = in ? (st ? st[t] : 0) : INT_MAX;
    row_lse[hh] = in ? lse_h[t] * kLog2e : 0.f;
    row_dr[hh] = in ? drow_h[t] : 0.f;
  }
  float dq[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[j][e] = 0.f;

  for (int it = 0; it < n_tiles; ++it) {
    const int n0 = k_begin + it * BN;
    if (it + 1 < n_tiles) {
      const int nb = (it + 1) & 1;
      load_rows<BN, D>(ks + nb * BN * LD, base, C, koff, n0 + BN, Tn);
      load_rows<BN, D>(vs + nb * BN * LD, base, C, voff, n0 + BN, Tn);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint16_t* kb = ks + (it & 1) * BN * LD;
    const uint16_t* vb = vs + (it & 1) * BN * LD;
    const bool skip = !active || n0 > w_last || n0 + BN - 1 < w_first_key;
    if (!skip) {
      const bool full = n0 + BN - 1 <= wq0 && n0 >= w_max_start && wq0 + 16 <= Tn;
      float s[BN / 8][4], dp[BN / 8][4];
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll 2
      for (int kk = 0; kk < D / 16; ++kk) {  // S = Q K^T, dP = dO V^T
        uint32_t aq[4], ag[4];
        load_a<LD>(aq, qs, warp * 16, kk * 16, lane);
        load_a<LD>(ag, dos, warp * 16, kk * 16, lane);
#pragma unroll
        for (int nb = 0; nb < BN / 16; ++nb) {
          uint32_t bk[4], bv[4];
          load_b_nt<LD>(bk, kb, nb * 16, kk * 16, lane);
          load_b_nt<LD>(bv, vb, nb * 16, kk * 16, lane);
          mma(s[2 * nb], aq, bk[0], bk[1]);
          mma(s[2 * nb + 1], aq, bk[2], bk[3]);
          mma(dp[2 * nb], ag, bv[0], bv[1]);
          mma(dp[2 * nb + 1], ag, bv[2], bv[3]);
        }
      }
      // dS = P (dP - Drow), P = exp(scale S - lse); masked elements 0.
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int hh = e >> 1, k = n0 + j * 8 + tig * 2 + (e & 1);
          const bool vis = full || (k >= row_s[hh] && k <= row_t[hh]);
          const float p = exp2_approx(fmaf(s[j][e], scale_log2, -row_lse[hh]));
          s[j][e] = vis ? p * (dp[j][e] - row_dr[hh]) : 0.f;
        }
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {  // dQ += dS K (dS rounded to bf16)
        uint32_t a[4];
        acc_to_a(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int db = 0; db < D / 16; ++db) {
          uint32_t bk[4];
          load_b_nn<LD>(bk, kb, kk * 16, db * 16, lane);
          mma(dq[2 * db], a, bk[0], bk[1]);
          mma(dq[2 * db + 1], a, bk[2], bk[3]);
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int t = row_t[hh];
    if (!active || t >= Tn) continue;
    bf16* dst = dqkv + (int64_t(b) * Tn + t) * C + int64_t(h) * D + tig * 2;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      store2(dst + j * 8, dq[j][2 * hh] * scale, dq[j][2 * hh + 1] * scale);
  }
}

// dk, dv parts of dqkv <- dout, qkv, lse, drow; starts i32[B,T] or null. grid
// (ceil(T/64), Hkv, B), block 128, warp w owning key rows 16 w..16 w + 15.
// Dynamic shared: K [64][LD], V [64][LD], Q [2][BMQ][LD], dO [2][BMQ][LD],
// then f32 lse (log2 units) [2][BMQ], f32 Drow [2][BMQ], i32 starts [2][BMQ].
template <int D, int BMQ>
__global__ void __launch_bounds__(kBlock)
    flash_bwd_dkv_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                         const bf16* __restrict__ qkv, const float* __restrict__ lse,
                         const float* __restrict__ drow, const int32_t* __restrict__ starts, int Tn,
                         int Hq, int Hkv, float scale, float scale_log2) {
  constexpr int LD = D + 8, BN = kWarps * 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* vs = ks + BN * LD;
  uint16_t* qs = vs + BN * LD;
  uint16_t* dos = qs + 2 * BMQ * LD;
  float* lse_s = reinterpret_cast<float*>(dos + 2 * BMQ * LD);
  float* dr_s = lse_s + 2 * BMQ;
  int32_t* st_s = reinterpret_cast<int32_t*>(dr_s + 2 * BMQ);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
  const int kvh = blockIdx.y, G = Hq / Hkv, b = blockIdx.z;
  const int k0 = int(blockIdx.x) * BN;  // the keys most queries see first
  const int64_t C = int64_t(Hq + 2 * Hkv) * D, OC = int64_t(Hq) * D;
  const int64_t koff = int64_t(Hq + kvh) * D, voff = int64_t(Hq + Hkv + kvh) * D;
  const bf16* base = qkv + int64_t(b) * Tn * C;
  const bf16* dbase = dout + int64_t(b) * Tn * OC;
  const int32_t* st = starts ? starts + int64_t(b) * Tn : nullptr;

  // Query tiles [qt_first, qt_end) that may see a key of the tile: from the one
  // holding query k0 to the last whose first query's first key is <= k_last
  // (starts is nondecreasing, so later tiles see none).
  const int k_last = min(k0 + BN, Tn) - 1;
  const int qt_first = k0 / BMQ;
  int qt_end = (Tn + BMQ - 1) / BMQ;
  if (st) {
    int lo = qt_first + 1;  // tile qt_first sees key k0: st[q] <= q <= k0
    while (lo < qt_end) {
      const int mid = (lo + qt_end) / 2;
      if (st[mid * BMQ] > k_last)
        qt_end = mid;
      else
        lo = mid + 1;
    }
  }
  const int n_q = qt_end - qt_first, n_items = G * n_q;

  // Item i: query head kvh G + i / n_q, query tile qt_first + i % n_q.
  auto load_item = [&](int i, int buf) {
    const int h = kvh * G + i / n_q, q0 = (qt_first + i % n_q) * BMQ;
    load_rows<BMQ, D>(qs + buf * BMQ * LD, base, C, int64_t(h) * D, q0, Tn);
    load_rows<BMQ, D>(dos + buf * BMQ * LD, dbase, OC, int64_t(h) * D, q0, Tn);
    if (threadIdx.x < BMQ) {
      const int r = threadIdx.x, q = q0 + r;
      const bool in = q < Tn;
      const int64_t row = (int64_t(b) * Hq + h) * Tn + q;
      lse_s[buf * BMQ + r] = in ? lse[row] * kLog2e : 0.f;
      dr_s[buf * BMQ + r] = in ? drow[row] : 0.f;
      st_s[buf * BMQ + r] = in ? (st ? st[q] : 0) : INT_MAX;  // rows past T see nothing
    }
  };

  load_rows<BN, D>(ks, base, C, koff, k0, Tn);
  load_rows<BN, D>(vs, base, C, voff, k0, Tn);
  load_item(0, 0);
  cp_async_commit();

  const int wk0 = k0 + warp * 16;
  const bool active = wk0 < Tn;
  const int w_last = min(wk0 + 16, Tn) - 1;
  int row_k[2];  // this thread's key rows
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) row_k[hh] = wk0 + gid + 8 * hh;
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.f;

  for (int it = 0; it < n_items; ++it) {
    if (it + 1 < n_items) load_item(it + 1, (it + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int buf = it & 1, q0 = (qt_first + it % n_q) * BMQ;
    const uint16_t* qb = qs + buf * BMQ * LD;
    const uint16_t* gb = dos + buf * BMQ * LD;
    const float* ls = lse_s + buf * BMQ;
    const float* drs = dr_s + buf * BMQ;
    const int32_t* sts = st_s + buf * BMQ;
    // Warp-uniform: no query of the tile sees the warp's keys when all come
    // before them or the first query's span starts after them.
    const bool skip = !active || q0 + BMQ - 1 < wk0 || sts[0] > w_last;
    if (!skip) {
      const bool full = wk0 + 15 <= q0 && sts[BMQ - 1] <= wk0 && q0 + BMQ <= Tn;
      float s[BMQ / 8][4], dp[BMQ / 8][4];
#pragma unroll
      for (int j = 0; j < BMQ / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll 2
      for (int kk = 0; kk < D / 16; ++kk) {  // S^T = K Q^T, dP^T = V dO^T
        uint32_t ak[4], av[4];
        load_a<LD>(ak, ks, warp * 16, kk * 16, lane);
        load_a<LD>(av, vs, warp * 16, kk * 16, lane);
#pragma unroll
        for (int nb = 0; nb < BMQ / 16; ++nb) {
          uint32_t bq[4], bg[4];
          load_b_nt<LD>(bq, qb, nb * 16, kk * 16, lane);
          load_b_nt<LD>(bg, gb, nb * 16, kk * 16, lane);
          mma(s[2 * nb], ak, bq[0], bq[1]);
          mma(s[2 * nb + 1], ak, bq[2], bq[3]);
          mma(dp[2 * nb], av, bg[0], bg[1]);
          mma(dp[2 * nb + 1], av, bg[2], bg[3]);
        }
      }
      // P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - Drow); masked elements 0.
#pragma unroll
      for (int j = 0; j < BMQ / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qc = j * 8 + tig * 2 + (e & 1), k = row_k[e >> 1];
          const bool vis = full || (k <= q0 + qc && k >= sts[qc]);
          const float p = exp2_approx(fmaf(s[j][e], scale_log2, -ls[qc]));
          s[j][e] = vis ? p : 0.f;
          dp[j][e] = vis ? p * (dp[j][e] - drs[qc]) : 0.f;
        }
#pragma unroll
      for (int kk = 0; kk < BMQ / 16; ++kk) {  // dV += P^T dO, dK += dS^T Q (P, dS rounded to bf16)
        uint32_t ap[4], ads[4];
        acc_to_a(ap, s[2 * kk], s[2 * kk + 1]);
        acc_to_a(ads, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
        for (int db = 0; db < D / 16; ++db) {
          uint32_t bg[4], bq[4];
          load_b_nn<LD>(bg, gb, kk * 16, db * 16, lane);
          load_b_nn<LD>(bq, qb, kk * 16, db * 16, lane);
          mma(dv[2 * db], ap, bg[0], bg[1]);
          mma(dv[2 * db + 1], ap, bg[2], bg[3]);
          mma(dk[2 * db], ads, bq[0], bq[1]);
          mma(dk[2 * db + 1], ads, bq[2], bq[3]);
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int k = row_k[hh];
    if (!active || k >= Tn) continue;
    bf16* row = dqkv + (int64_t(b) * Tn + k) * C + tig * 2;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      store2(row + koff + j * 8, dk[j][2 * hh] * scale, dk[j][2 * hh + 1] * scale);
      store2(row + voff + j * 8, dv[j][2 * hh], dv[j][2 * hh + 1]);
    }
  }
}

// ---- launches ----

struct Shape {
  int64_t B, T;
  int Hq, Hkv, D;
};

Shape shape_of(const Tensor& qkv, int64_t hq, int64_t hkv) {
  NK_CHECK(qkv.dim(1) <= INT32_MAX / 2, "attention: T = {} is too long", qkv.dim(1));
  return {qkv.dim(0), qkv.dim(1), int(hq), int(hkv), int(qkv.dim(2) / (hq + 2 * hkv))};
}

// fn(std::integral_constant<int, D>) for the head dims the kernels are built for.
template <typename Fn>
void dispatch_head_dim(int D, Fn&& fn) {
  switch (D) {
    case 32:
      fn(std::integral_constant<int, 32>{});
      break;
    case 64:
      fn(std::integral_constant<int, 64>{});
      break;
    case 128:
      fn(std::integral_constant<int, 128>{});
      break;
    default:
      NK_CHECK(false, "flash attention: head_dim {} is not supported", D);
  }
}

// Lets `kernel` use `bytes` of dynamic shared memory (above 48 KiB needs the opt-in).
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > kDefaultSmem)
    NK_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

unsigned tiles(int64_t n, int tile) {
  return unsigned((n + tile - 1) / tile);
}

}  // namespace

bool flash_attention_supported(DType dtype, int64_t head_dim,
                               std::initializer_list<const Tensor*> tensors) {
  if (dtype != DType::BF16 || (head_dim != 32 && head_dim != 64 && head_dim != 128)) return false;
  for (const Tensor* t : tensors)
    if (reinterpret_cast<uintptr_t>(t->raw()) % 16 != 0) return false;
  return true;
}

void flash_attention_forward(Tensor out, Tensor lse, const Tensor& qkv, int64_t n_q_heads,
                             int64_t n_kv_heads, const Tensor& starts) {
  const Shape d = shape_of(qkv, n_q_heads, n_kv_heads);
  if (d.B * d.T == 0) return;
  const int32_t* st = starts.defined() ? starts.data<int32_t>() : nullptr;
  const float scale = 1.f / std::sqrt(float(d.D)), scale_log2 = scale * kLog2e;
  dispatch_head_dim(d.D, [&](auto dim) {
    constexpr int D = decltype(dim)::value, MR = Tiles<D>::kFwdMR, BN = Tiles<D>::kFwdBN;
    constexpr int BM = kWarps * 16 * MR;
    const size_t smem = sizeof(uint16_t) * size_t(BM + 4 * BN) * (D + 8);
    auto kernel = flash_fwd_kernel<D, MR, BN>;
    allow_smem(kernel, smem);
    kernel<<<dim3(tiles(d.T, BM), unsigned(d.Hq), unsigned(d.B)), kBlock, smem,
             nk::cuda::stream()>>>(out.data<bf16>(), lse.data<float>(), qkv.data<bf16>(), st,
                                   int(d.T), d.Hq, d.Hkv, scale, scale_log2);
    NK_CUDA_LAUNCHED("flash_fwd_kernel");
  });
}

void flash_attention_backward(Tensor dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, int64_t n_q_heads, int64_t n_kv_heads,
                              const Tensor& starts) {
  const Shape d = shape_of(qkv, n_q_heads, n_kv_heads);
  if (d.B * d.T == 0) return;
  const int32_t* st = starts.defined() ? starts.data<int32_t>() : nullptr;
  const float scale = 1.f / std::sqrt(float(d.D)), scale_log2 = scale * kLog2e;
  cudaStream_t stream = nk::cuda::stream();
  Tensor drow = Tensor::empty({d.B, d.Hq, d.T}, DType::F32, Device::CUDA);
  const int64_t rows = d.B * d.T * d.Hq;
  dispatch_head_dim(d.D, [&](auto dim) {
    constexpr int D = decltype(dim)::value, BN = Tiles<D>::kDqBN, BMQ = Tiles<D>::kDkvBMQ;
    flash_drow_kernel<D><<<blocks_for(rows * (D / 8), kBlock), kBlock, 0, stream>>>(
        drow.data<float>(), dout.data<bf16>(), out.data<bf16>(), rows, int(d.T), d.Hq);
    NK_CUDA_LAUNCHED("flash_drow_kernel");

    constexpr int BKV = kWarps * 16;  // key rows per dK/dV block
    const size_t smem_dkv = sizeof(uint16_t) * size_t(2 * BKV + 4 * BMQ) * (D + 8) +
                            size_t(2 * BMQ) * (2 * sizeof(float) + sizeof(int32_t));
    auto dkv = flash_bwd_dkv_kernel<D, BMQ>;
    allow_smem(dkv, smem_dkv);
    dkv<<<dim3(tiles(d.T, BKV), unsigned(d.Hkv), unsigned(d.B)), kBlock, smem_dkv, stream>>>(
        dqkv.data<bf16>(), dout.data<bf16>(), qkv.data<bf16>(), lse.data<float>(),
        drow.data<float>(), st, int(d.T), d.Hq, d.Hkv, scale, scale_log2);
    NK_CUDA_LAUNCHED("flash_bwd_dkv_kernel");

    constexpr int BM = kWarps * 16;
    const size_t smem_dq = sizeof(uint16_t) * size_t(2 * BM + 4 * BN) * (D + 8);
    auto dq = flash_bwd_dq_kernel<D, BN>;
    allow_smem(dq, smem_dq);
    dq<<<dim3(tiles(d.T, BM), unsigned(d.Hq), unsigned(d.B)), kBlock, smem_dq, stream>>>(
        dqkv.data<bf16>(), dout.data<bf16>(), qkv.data<bf16>(), lse.data<float>(),
        drow.data<float>(), st, int(d.T), d.Hq, d.Hkv, scale, scale_log2);
    NK_CUDA_LAUNCHED("flash_bwd_dq_kernel");
  });
}

}  // namespace nk::ops::cuda
