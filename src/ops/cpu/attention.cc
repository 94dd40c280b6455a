// Causal grouped-query attention kernels, flash-style (FlashAttention-2
// schedule); arguments checked by ops/attention.cc.
//
// Forward: one task per (batch, query head, query block of kBlock rows). Key
// blocks up to the diagonal stream through an online softmax; the task holds
// only kBlock x kBlock scores, an fp32 output accumulator and the running row
// max m and sum l. lse = m + log l is saved for the backward.
//
// Backward: one task per (batch, kv head). It owns dK and dV of its kv head and
// dQ of the query heads in its group, so every gradient element has exactly one
// writer and a fixed summation order (deterministic, no atomics). Probabilities
// are recomputed tile by tile from lse, transposed (key rows x query columns) so
// that all five tile products are plain row-major GEMMs:
//   S^T = K Q^T,  P^T = exp(S^T - lse),  dV += P^T dO,  dP^T = V dO^T,
//   dS^T = P^T (dP^T - Drow),  dK += dS^T Q,  dQ^T += K^T dS^T,
// with Drow_i = rowsum(dO_i * O_i). Q is pre-scaled by 1/sqrt(D) (or the given scale), which also
// gives dK its scale; dQ is scaled once when written.
//
// Packed rows and sliding windows: cu_seqlens and the window are expanded once
// per call into each token's first visible key st[t] = max(document start,
// t - window + 1), nondecreasing in t. Query t sees keys [st[t], t], so a query
// block starting at q0 never sees key tiles ending before st[q0]: those tiles
// (earlier documents, keys out of the window) are skipped (forward: the key
// loop starts at st[q0]'s tile; backward: the query loop of a key tile stops at
// the first block with st[q0] past it). A tile below the diagonal that
// straddles a boundary or the window's edge is cut to the rows and columns
// that see anything, then masked per row.
//
// Soft-capping (Gemma 2): the scaled scores s become c tanh(s / c) where they
// are visible, before the online softmax; the backward recomputes t =
// tanh(s / c) per tile and multiplies dS by 1 - t^2.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "ops/cpu/attention_tiles.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"
#include "ops/cpu/softmax_math.h"
#include "ops/cpu/tile_gemm.h"

namespace nk::ops::NK_CPU_NS {
namespace {

namespace sm = softmax;

constexpr int64_t kBlock = 64;  // query and key tile edge; a 64x64 fp32 tile is 16 KiB
// Diagonal tiles are computed in strips of kStrip rows, each only up to the
// causal edge, which skips ~3/8 of their work.
constexpr int64_t kStrip = 16;

struct Dims {
  int64_t B, T, Hq, Hkv, D, C;  // C = (Hq + 2*Hkv)*D elements per token in qkv
  int64_t group() const { return Hq / Hkv; }
  int64_t blocks() const { return (T + kBlock - 1) / kBlock; }
};

Dims dims_of(const Tensor& qkv, int64_t hq, int64_t hkv) {
  const int64_t c = qkv.dim(2);
  return {qkv.dim(0), qkv.dim(1), hq, hkv, c / (hq + 2 * hkv), c};
}

// ---- forward ----

// Online-softmax update of one query row with a tile of scores s[0, n), of
// which the first `valid` are allowed (causal). s becomes the probabilities
// (exactly 0 where masked); returns the factor the old accumulator is scaled by.
float online_row(float* s, int64_t valid, int64_t n, float& m, float& l) {
  const float m_new = std::max(m, sm::max_of(s, valid));
  const float corr = sm::fast_exp(m - m_new);  // m = -inf on the first tile: ~0
  const float sum = sm::sum_exp_shifted(s, valid, m_new, s);
  for (int64_t j = valid; j < n; ++j) s[j] = 0.f;
  l = l * corr + sum;
  m = m_new;
  return corr;
}

// starts: each token's first visible key [B*T], or nullptr (plain causal).
// scale: the scores' factor; softcap > 0: capped scores.
template <typename T>
void forward_impl(T* out, float* lse, const T* qkv, const Dims d, const int32_t* starts,
                  float scale, float softcap) {
  const int64_t nb = d.blocks(), D = d.D;
  parallel_for(d.B * d.Hq * nb, 1, [&](int64_t begin, int64_t end) {
    float* q =
        attention_scratch(size_t(kBlock) * (4 * D + kBlock + 2));  // Q, O [kBlock,D]; Kt; V; S
    float* o = q + kBlock * D;
    float* kt = o + kBlock * D;  // [D, kBlock]
    float* v = kt + kBlock * D;  // [kBlock, D]
    float* s = v + kBlock * D;   // [kBlock, kBlock]
    float* m = s + kBlock * kBlock;
    float* l = m + kBlock;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t qb = task % nb, h = task / nb % d.Hq, b = task / nb / d.Hq;
      const int64_t kvh = h / d.group(), q0 = qb * kBlock, qn = std::min(kBlock, d.T - q0);
      const T* base = qkv + b * d.T * d.C;
      load_rows(q, D, base + q0 * d.C + h * D, d.C, qn, D, scale);
      std::fill(o, o + qn * D, 0.f);
      std::fill(m, m + qn, -INFINITY);
      std::fill(l, l + qn, 0.f);
      const int32_t* st = starts ? starts + b * d.T + q0 : nullptr;  // row i's first key
      for (int64_t kb = st ? st[0] / kBlock : 0; kb <= qb; ++kb) {
        const int64_t k0 = kb * kBlock, kn = std::min(kBlock, d.T - k0);
        load_cols(kt, kBlock, base + k0 * d.C + (d.Hq + kvh) * D, d.C, kn, D);
        load_rows(v, D, base + k0 * d.C + (d.Hq + d.Hkv + kvh) * D, d.C, kn, D);
        const bool diag = kb == qb;  // then k0 == q0, kn == qn
        // Below the diagonal, rows [0, rn) see some key of the tile and
        // columns [c0, kn) hold every key they see (the whole tile unpacked).
        int64_t rn = qn, c0 = 0;
        if (st && !diag) {
          rn = std::upper_bound(st, st + qn, int32_t(k0 + kn - 1)) - st;
          c0 = std::clamp<int64_t>(st[0] - k0, 0, kn);
        }
        if (!diag) tile_gemm(rn, kn - c0, D, q, D, kt + c0, kBlock, s + c0, kBlock, false);
        for (int64_t r0 = 0; diag && r0 < qn; r0 += kStrip)  // only keys <= the strip's last row
          tile_gemm(std::min(kStrip, qn - r0), std::min(kn, r0 + kStrip), D, q + r0 * D, D, kt,
                    kBlock, s + r0 * kBlock, kBlock, false);
        for (int64_t i = 0; i < rn; ++i) {
          // Row i sees columns [lo, hi): from its first visible key, and on the
          // diagonal tile (k0 == q0) up to itself. lo < hi for every row < rn.
          float* si = s + i * kBlock;
          const int64_t lo = st ? std::clamp<int64_t>(st[i] - k0, c0, kn) : 0;
          std::fill(si + c0, si + lo, 0.f);
          if (softcap > 0.f)
            for (int64_t j = lo; j < (diag ? i + 1 : kn); ++j)
              si[j] = softcap * std::tanh(si[j] / softcap);
          const float corr = online_row(si + lo, (diag ? i + 1 : kn) - lo, kn - lo, m[i], l[i]);
          if (corr != 1.f)
            for (int64_t c = 0; c < D; ++c) o[i * D + c] *= corr;
        }
        if (!diag) tile_gemm(rn, D, kn - c0, s + c0, kBlock, v + c0 * D, D, o, D, true);
        for (int64_t r0 = 0; diag && r0 < qn; r0 += kStrip)
          tile_gemm(std::min(kStrip, qn - r0), D, std::min(kn, r0 + kStrip), s + r0 * kBlock,
                    kBlock, v, D, o + r0 * D, D, true);
      }
      for (int64_t i = 0; i < qn; ++i) {
        const float inv = 1.f / l[i];
        T* dst = out + (b * d.T + q0 + i) * d.Hq * D + h * D;
        for (int64_t c = 0; c < D; ++c) dst[c] = from_f32<T>(o[i * D + c] * inv);
        lse[(b * d.Hq + h) * d.T + q0 + i] = m[i] + std::log(l[i]);
      }
    }
  });
}

// ---- backward ----

// Per-thread fp32 working set of one (batch, kv head) task; [T,D] arrays are
// token-major, [D,T] arrays ("t" suffix) are their transposes with leading
// dimension ldt = T + 16: a power-of-two stride (T = 2048 is 8 KiB) would map
// every row of a tile column to the same L1 set.
struct BackwardScratch {
  float *k, *kt, *v, *dk, *dv;                // kv head
  float *q, *qt, *dout, *doutt, *dqt, *drow;  // current query head
  float *st, *dpt;                            // [kBlock, kBlock] tiles: key rows x query columns
  int64_t ldt;
  BackwardScratch(int64_t T, int64_t D) : ldt(T + 16) {
    const int64_t td = T * D, dt = D * ldt;
    float* p = attention_scratch(size_t(6 * td + 4 * dt + T + 2 * kBlock * kBlock));
    for (float** a : {&k, &v, &dk, &dv, &q, &dout}) *a = p, p += td;
    for (float** a : {&kt, &qt, &doutt, &dqt}) *a = p, p += dt;
    drow = p, p += T;
    st = p, p += kBlock * kBlock;
    dpt = p;
  }
};

// With soft-capping c: S' = c tanh(S / c), P = exp(S' - lse) and
// dS = P (dP - Drow) (1 - tanh^2), over n visible queries.
inline void probs_and_dscores_capped(float* s, float* dp, const float* lse, const float* drow,
                                     int64_t n, float c) {
  for (int64_t i = 0; i < n; ++i) {
    const float t = std::tanh(s[i] / c);
    const float p = sm::fast_exp(c * t - lse[i]);
    s[i] = p;
    dp[i] = p * (dp[i] - drow[i]) * (1.f - t * t);
  }
}

// One key row of a transposed tile: s = P = exp(S - lse) and dp = dS = P (dP - Drow),
// over n visible queries.
inline void probs_and_dscores(float* s, float* dp, const float* lse, const float* drow, int64_t n) {
#ifdef __AVX512F__
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? __mmask16(0xFFFF) : sm::tail_mask(n - i);
    const __m512 p = sm::exp16(
        _mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), _mm512_maskz_loadu_ps(k, lse + i)));
    _mm512_mask_storeu_ps(s + i, k, p);
    const __m512 g =
        _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dp + i), _mm512_maskz_loadu_ps(k, drow + i));
    _mm512_mask_storeu_ps(dp + i, k, _mm512_mul_ps(p, g));
  }
#else
  for (int64_t i = 0; i < n; ++i) {
    const float p = sm::fast_exp(s[i] - lse[i]);
    s[i] = p;
    dp[i] = p * (dp[i] - drow[i]);
  }
#endif
}

// Gradients of one (query block, key block) tile into ws.dk/dv/dqt. sq: the
// first visible keys of queries q0.. (nullptr: plain causal).
void backward_tile(BackwardScratch& w, const float* lse, const int32_t* sq, int64_t D, int64_t q0,
                   int64_t qn, int64_t k0, int64_t kn, float softcap) {
  float *st = w.st, *dpt = w.dpt;
  const int64_t T = w.ldt;     // leading dimension of the transposed arrays
  const bool diag = k0 == q0;  // then kn == qn and key row j sees queries i >= j
  // Below the diagonal, key rows [j0, kn) are seen by some query and query
  // columns [0, cn) see some key (the whole tile unpacked).
  int64_t j0 = 0, cn = qn;
  if (sq && !diag) {
    j0 = std::clamp<int64_t>(sq[0] - k0, 0, kn);
    cn = std::upper_bound(sq, sq + qn, int32_t(k0 + kn - 1)) - sq;
  }
  if (!diag) {
    tile_gemm(kn - j0, cn, D, w.k + (k0 + j0) * D, D, w.qt + q0, T, st + j0 * kBlock, kBlock,
              false);
    tile_gemm(kn - j0, cn, D, w.v + (k0 + j0) * D, D, w.doutt + q0, T, dpt + j0 * kBlock, kBlock,
              false);
  }
  for (int64_t r0 = 0; diag && r0 < kn; r0 += kStrip) {  // key strip r0.. sees queries >= r0
    const int64_t rn = std::min(kStrip, kn - r0), off = r0 * kBlock + r0;
    tile_gemm(rn, qn - r0, D, w.k + (k0 + r0) * D, D, w.qt + q0 + r0, T, st + off, kBlock, false);
    tile_gemm(rn, qn - r0, D, w.v + (k0 + r0) * D, D, w.doutt + q0 + r0, T, dpt + off, kBlock,
              false);
  }
  const float* l = lse + q0;
  const float* dr = w.drow + q0;
  const int64_t ncols = diag ? qn : cn;
  for (int64_t j = j0; j < kn; ++j) {
    // Key k0+j is visible to query q0+i iff st[q0+i] <= k0+j <= q0+i: queries [i0, i1).
    const int64_t i0 = std::clamp<int64_t>(k0 + j - q0, 0, qn);
    const int64_t i1 =
        sq ? std::max<int64_t>(i0, std::upper_bound(sq, sq + ncols, int32_t(k0 + j)) - sq) : ncols;
    float* s = st + j * kBlock;
    float* dp = dpt + j * kBlock;
    for (int64_t i = 0; i < i0; ++i) s[i] = dp[i] = 0.f;
    if (softcap > 0.f)
      probs_and_dscores_capped(s + i0, dp + i0, l + i0, dr + i0, i1 - i0, softcap);
    else
      probs_and_dscores(s + i0, dp + i0, l + i0, dr + i0, i1 - i0);
    for (int64_t i = i1; i < ncols; ++i) s[i] = dp[i] = 0.f;
  }
  if (!diag) {
    const int64_t rn = kn - j0;
    float *sj = st + j0 * kBlock, *dpj = dpt + j0 * kBlock;
    tile_gemm(rn, D, cn, sj, kBlock, w.dout + q0 * D, D, w.dv + (k0 + j0) * D, D, true);
    tile_gemm(rn, D, cn, dpj, kBlock, w.q + q0 * D, D, w.dk + (k0 + j0) * D, D, true);
    tile_gemm(D, cn, rn, w.kt + k0 + j0, T, dpj, kBlock, w.dqt + q0, T, true);
    return;
  }
  for (int64_t r0 = 0; r0 < kn; r0 += kStrip) {
    const int64_t rn = std::min(kStrip, kn - r0), off = r0 * kBlock + r0;
    tile_gemm(rn, D, qn - r0, st + off, kBlock, w.dout + (q0 + r0) * D, D, w.dv + (k0 + r0) * D, D,
              true);
    tile_gemm(rn, D, qn - r0, dpt + off, kBlock, w.q + (q0 + r0) * D, D, w.dk + (k0 + r0) * D, D,
              true);
    // Query strip r0.. receives from keys < r0 + rn.
    tile_gemm(D, rn, std::min(kn, r0 + kStrip), w.kt + k0, T, dpt + r0, kBlock, w.dqt + q0 + r0, T,
              true);
  }
}

template <typename T>
void backward_impl(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                   const Dims d, const int32_t* starts, float scale, float softcap) {
  const int64_t nb = d.blocks(), D = d.D, Tn = d.T, OC = d.Hq * D;
  parallel_for(d.B * d.Hkv, 1, [&](int64_t begin, int64_t end) {
    BackwardScratch w(Tn, D);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kvh = task % d.Hkv, b = task / d.Hkv;
      const T* x = qkv + b * Tn * d.C;
      T* dx = dqkv + b * Tn * d.C;
      const int64_t koff = (d.Hq + kvh) * D, voff = (d.Hq + d.Hkv + kvh) * D;
      load_rows(w.k, D, x + koff, d.C, Tn, D);
      load_cols(w.kt, w.ldt, x + koff, d.C, Tn, D);
      load_rows(w.v, D, x + voff, d.C, Tn, D);
      std::fill(w.dk, w.dk + Tn * D, 0.f);
      std::fill(w.dv, w.dv + Tn * D, 0.f);
      for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h) {
        const T* g = dout + b * Tn * OC + h * D;
        const T* o = out + b * Tn * OC + h * D;
        load_rows(w.q, D, x + h * D, d.C, Tn, D, scale);
        load_cols(w.qt, w.ldt, x + h * D, d.C, Tn, D, scale);
        load_rows(w.dout, D, g, OC, Tn, D);
        load_cols(w.doutt, w.ldt, g, OC, Tn, D);
        for (int64_t i = 0; i < Tn; ++i) {
          float acc = 0;
          for (int64_t c = 0; c < D; ++c) acc += w.dout[i * D + c] * to_f32(o[i * OC + c]);
          w.drow[i] = acc;
        }
        std::fill(w.dqt, w.dqt + w.ldt * D, 0.f);
        const float* lh = lse + (b * d.Hq + h) * Tn;
        const int32_t* sb = starts ? starts + b * Tn : nullptr;
        for (int64_t kb = 0; kb < nb; ++kb) {
          const int64_t k0 = kb * kBlock, kn = std::min(kBlock, Tn - k0);
          for (int64_t qb = kb; qb < nb; ++qb) {
            const int64_t q0 = qb * kBlock;
            if (sb && sb[q0] >= k0 + kn) break;  // this and later query blocks start after the tile
            backward_tile(w, lh, sb ? sb + q0 : nullptr, D, q0, std::min(kBlock, Tn - q0), k0, kn,
                          softcap);
          }
        }
        for (int64_t i = 0; i < Tn; ++i)
          for (int64_t c = 0; c < D; ++c)
            dx[i * d.C + h * D + c] = from_f32<T>(scale * w.dqt[c * w.ldt + i]);
      }
      for (int64_t i = 0; i < Tn; ++i)
        for (int64_t c = 0; c < D; ++c) {
          dx[i * d.C + koff + c] = from_f32<T>(w.dk[i * D + c]);
          dx[i * d.C + voff + c] = from_f32<T>(w.dv[i * D + c]);
        }
    }
  });
}

// Each token's first visible key [B*T], max(document start, t - window + 1),
// from cu_seqlens i32[B, S+1] and the window; nullptr when neither restricts
// plain causal attention (no cu_seqlens, and window 0 or >= T). Grow-only
// buffer of the calling thread.
const int32_t* first_keys(const Tensor& cu, int64_t window, const Dims& d) {
  if (window >= d.T) window = 0;  // every query's window reaches back to key 0
  if (!cu.defined() && window == 0) return nullptr;
  thread_local std::vector<int32_t> starts;
  if (starts.size() < size_t(d.B * d.T)) starts.resize(size_t(d.B * d.T));
  const int64_t n = cu.defined() ? cu.dim(1) : 0;
  for (int64_t b = 0; b < d.B; ++b) {
    int32_t* sb = starts.data() + b * d.T;
    if (!cu.defined()) std::fill(sb, sb + d.T, 0);
    const int32_t* c = cu.defined() ? cu.data<int32_t>() + b * n : nullptr;
    if (c && (c[0] != 0 || c[n - 1] != d.T))
      fail("attention: cu_seqlens row {} runs from {} to {}; it must run from 0 to T = {}", b, c[0],
           c[n - 1], d.T);
    for (int64_t k = 0; c && k + 1 < n; ++k)
      if (c[k + 1] < c[k])
        fail("attention: cu_seqlens row {} decreases at entry {} ({} after {})", b, k + 1, c[k + 1],
             c[k]);
    // Validated whole first: then every c[k] lies in [0, T].
    for (int64_t k = 0; c && k + 1 < n; ++k) std::fill(sb + c[k], sb + c[k + 1], c[k]);
    for (int64_t t = window; window > 0 && t < d.T; ++t)
      sb[t] = std::max(sb[t], int32_t(t - window + 1));
  }
  return starts.data();
}

}  // namespace

void attention_forward(Tensor out, Tensor lse, const Tensor& qkv, int64_t n_q_heads,
                       int64_t n_kv_heads, const Tensor& cu_seqlens, int64_t window, float scale,
                       float softcap) {
  const Dims d = dims_of(qkv, n_q_heads, n_kv_heads);
  const int32_t* starts = first_keys(cu_seqlens, window, d);
  if (scale == 0.f) scale = 1.f / std::sqrt(float(d.D));
  if (qkv.dtype() == DType::F32)
    forward_impl(out.data<float>(), lse.data<float>(), qkv.data<float>(), d, starts, scale,
                 softcap);
  else
    forward_impl(out.data<bf16>(), lse.data<float>(), qkv.data<bf16>(), d, starts, scale, softcap);
}

void attention_backward(Tensor dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, int64_t n_q_heads, int64_t n_kv_heads,
                        const Tensor& cu_seqlens, int64_t window, float scale, float softcap) {
  const Dims d = dims_of(qkv, n_q_heads, n_kv_heads);
  const int32_t* starts = first_keys(cu_seqlens, window, d);
  if (scale == 0.f) scale = 1.f / std::sqrt(float(d.D));
  if (qkv.dtype() == DType::F32)
    backward_impl(dqkv.data<float>(), dout.data<float>(), qkv.data<float>(), out.data<float>(),
                  lse.data<float>(), d, starts, scale, softcap);
  else
    backward_impl(dqkv.data<bf16>(), dout.data<bf16>(), qkv.data<bf16>(), out.data<bf16>(),
                  lse.data<float>(), d, starts, scale, softcap);
}

}  // namespace nk::ops::NK_CPU_NS
