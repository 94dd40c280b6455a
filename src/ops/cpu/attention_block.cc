// Attention of local queries to one key/value block (ops.h), the ring
// attention step of context parallelism, in tiles of kBlock queries x kBlock
// keys as the causal kernel (attention.cc) with the same tile products
// (tile_gemm.h). Which pairs meet comes from the global positions: per tile
// from the extreme positions it holds (none, all, or masked per element),
// so a block of an earlier chunk runs unmasked and a later chunk's tiles
// are skipped.
//
// Forward: one task per (batch, query head, query tile): the block's own
// online softmax over its key tiles (max m, sum l, output o), then merged
// into the running (out, lse):
//   lse' = log(e^lse + e^lse_b),  out' = out e^(lse - lse') + (o / l) e^(lse_b - lse').
// Backward: one task per (batch, kv head), the only writer of that head's dk
// and dv and of the dq of its query heads (deterministic, no atomics); tiles
// transposed (key rows x query columns) as in attention.cc:
//   S^T = K Q^T, P^T = exp(S^T - lse), dV += P^T dO, dP^T = V dO^T,
//   dS^T = P^T (dP^T - Drow), dK += dS^T Q, dQ^T += K^T dS^T
// with Drow_i = dO_i . O_i over the final output; Q pre-scaled by the scores'
// factor (1/sqrt(D) unless given). Capped scores (softcap c, Gemma 2): S' =
// c tanh(S / c) in the softmax, and dS = dS' (1 - tanh^2(S / c)).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "ops/cpu/attention_tiles.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"
#include "ops/cpu/softmax_math.h"
#include "ops/cpu/tile_gemm.h"

namespace nk::ops::NK_CPU_NS {
namespace {

constexpr int64_t kBlock = 64;

struct Dims {
  int64_t B, Tq, Tk, Hq, Hkv, D, C, KC;  // C: qkv's row width, KC: kv's (2 Hkv D)
  float scale, softcap;                  // the scores' factor; > 0: capped scores
  int64_t group() const { return Hq / Hkv; }
};

Dims dims_of(const Tensor& qkv, const Tensor& kv, int64_t hq, int64_t hkv, float scale,
             float softcap) {
  const int64_t c = qkv.dim(2), D = c / (hq + 2 * hkv);
  return {qkv.dim(0), qkv.dim(1), kv.dim(1),
          hq,         hkv,        D,
          c,          kv.dim(2),  scale > 0.f ? scale : 1.f / std::sqrt(float(D)),
          softcap};
}

enum class Tile { None, All, Masked };

// Which query/key pairs meet: the global positions qpos [Tq] and kpos [Tk],
// the window, and with packed rows each query's document start qstart
// [B, Tq] (null: one document per row, every start 0).
struct Mask {
  const int32_t *qpos, *kpos;
  int64_t window;
  const int32_t* qstart;
  int64_t Tq;

  // Query i of row b sees key j.
  bool visible(int64_t b, int64_t i, int64_t j) const {
    const int32_t qp = qpos[i], kp = kpos[j];
    return kp <= qp && (window == 0 || int64_t(qp) - kp < window) &&
           (!qstart || kp >= qstart[b * Tq + i]);
  }
  // How queries [q0, q0 + qn) of row b meet keys [k0, k0 + kn), from the
  // extreme positions and document starts.
  Tile tile(int64_t b, int64_t q0, int64_t qn, int64_t k0, int64_t kn) const {
    const auto [q_lo, q_hi] = std::minmax_element(qpos + q0, qpos + q0 + qn);
    const auto [k_lo, k_hi] = std::minmax_element(kpos + k0, kpos + k0 + kn);
    int32_t s_lo = 0, s_hi = 0;
    if (qstart) {
      const int32_t* s = qstart + b * Tq + q0;
      const auto [lo, hi] = std::minmax_element(s, s + qn);
      s_lo = *lo;
      s_hi = *hi;
    }
    if (*k_lo > *q_hi || (window > 0 && int64_t(*q_lo) - *k_hi >= window) || *k_hi < s_lo)
      return Tile::None;
    if (*k_hi <= *q_lo && (window == 0 || int64_t(*q_hi) - *k_lo < window) && *k_lo >= s_hi)
      return Tile::All;
    return Tile::Masked;
  }
};

template <typename T>
void forward_impl(float* out, float* lse, const T* qkv, const T* kv, const Mask mk, const Dims d) {
  const int64_t D = d.D, nq = (d.Tq + kBlock - 1) / kBlock;
  const float scale = d.scale, cap = d.softcap;
  parallel_for(d.B * d.Hq * nq, 1, [&](int64_t begin, int64_t end) {
    float* q =
        attention_scratch(size_t(kBlock) * (4 * D + kBlock + 2));  // Q, O [kBlock, D]; Kt; V; S
    float* o = q + kBlock * D;
    float* kt = o + kBlock * D;  // [D, kBlock]
    float* v = kt + kBlock * D;  // [kBlock, D]
    float* s = v + kBlock * D;   // [kBlock, kBlock]
    float* m = s + kBlock * kBlock;
    float* l = m + kBlock;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t qb = task % nq, h = task / nq % d.Hq, b = task / nq / d.Hq;
      const int64_t kvh = h / d.group(), q0 = qb * kBlock, qn = std::min(kBlock, d.Tq - q0);
      load_rows(q, D, qkv + (b * d.Tq + q0) * d.C + h * D, d.C, qn, D, scale);
      std::fill(o, o + qn * D, 0.f);
      std::fill(m, m + qn, -INFINITY);
      std::fill(l, l + qn, 0.f);
      for (int64_t k0 = 0; k0 < d.Tk; k0 += kBlock) {
        const int64_t kn = std::min(kBlock, d.Tk - k0);
        const Tile kind = mk.tile(b, q0, qn, k0, kn);
        if (kind == Tile::None) continue;
        const T* base = kv + (b * d.Tk + k0) * d.KC;
        load_cols(kt, kBlock, base + kvh * D, d.KC, kn, D);
        load_rows(v, D, base + (d.Hkv + kvh) * D, d.KC, kn, D);
        tile_gemm(qn, kn, D, q, D, kt, kBlock, s, kBlock, false);
        for (int64_t i = 0; i < qn; ++i) {
          float* si = s + i * kBlock;
          float rmax = -INFINITY;
          for (int64_t j = 0; j < kn; ++j) {
            if (cap > 0.f) si[j] = cap * std::tanh(si[j] / cap);
            if (kind == Tile::Masked && !mk.visible(b, q0 + i, k0 + j)) si[j] = -INFINITY;
            rmax = std::max(rmax, si[j]);
          }
          const float m_new = std::max(m[i], rmax);
          if (m_new == -INFINITY) {  // nothing seen yet: the row adds nothing
            std::fill(si, si + kn, 0.f);
            continue;
          }
          const float corr = m[i] == -INFINITY ? 0.f : softmax::fast_exp(m[i] - m_new);
          float sum = 0;
          for (int64_t j = 0; j < kn; ++j) {
            si[j] = si[j] == -INFINITY ? 0.f : softmax::fast_exp(si[j] - m_new);
            sum += si[j];
          }
          l[i] = l[i] * corr + sum;
          m[i] = m_new;
          if (corr != 1.f)
            for (int64_t c = 0; c < D; ++c) o[i * D + c] *= corr;
        }
        tile_gemm(qn, D, kn, s, kBlock, v, D, o, D, true);
      }
      for (int64_t i = 0; i < qn; ++i) {
        if (l[i] == 0.f) continue;  // no visible key in this block
        const float lse_b = m[i] + std::log(l[i]);
        float& run = lse[(b * d.Hq + h) * d.Tq + q0 + i];
        const float hi = std::max(run, lse_b);
        const float merged = hi + std::log(std::exp(run - hi) + std::exp(lse_b - hi));
        const float keep = run == -INFINITY ? 0.f : std::exp(run - merged);
        const float add = std::exp(lse_b - merged) / l[i];
        float* dst = out + (b * d.Tq + q0 + i) * d.Hq * D + h * D;
        for (int64_t c = 0; c < D; ++c) dst[c] = dst[c] * keep + o[i * D + c] * add;
        run = merged;
      }
    }
  });
}

template <typename T>
void backward_impl(float* dq, float* dkv, const T* dout, const T* out, const float* lse,
                   const T* qkv, const T* kv, const Mask mk, const Dims d) {
  const int64_t D = d.D, OC = d.Hq * D, Tq = d.Tq, Tk = d.Tk;
  const int64_t ldq = Tq + 16, ldk = Tk + 16;  // transposed arrays' leading dimensions
  const float scale = d.scale, cap = d.softcap;
  parallel_for(d.B * d.Hkv, 1, [&](int64_t begin, int64_t end) {
    float* p = attention_scratch(
        size_t(4 * Tk * D + D * ldk + 2 * Tq * D + 3 * D * ldq + Tq + 2 * kBlock * kBlock));
    float *k = p, *v = k + Tk * D, *dk = v + Tk * D, *dv = dk + Tk * D, *kt = dv + Tk * D;
    float *q = kt + D * ldk, *g = q + Tq * D, *qt = g + Tq * D, *gt = qt + D * ldq;
    float *dqt = gt + D * ldq, *drow = dqt + D * ldq, *st = drow + Tq, *dpt = st + kBlock * kBlock;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kvh = task % d.Hkv, b = task / d.Hkv;
      const T* kb = kv + b * Tk * d.KC + kvh * D;
      const T* vb = kv + b * Tk * d.KC + (d.Hkv + kvh) * D;
      load_rows(k, D, kb, d.KC, Tk, D);
      load_cols(kt, ldk, kb, d.KC, Tk, D);
      load_rows(v, D, vb, d.KC, Tk, D);
      std::fill(dk, dk + Tk * D, 0.f);
      std::fill(dv, dv + Tk * D, 0.f);
      for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h) {
        const T* qh = qkv + b * Tq * d.C + h * D;
        const T* gh = dout + b * Tq * OC + h * D;
        const T* oh = out + b * Tq * OC + h * D;
        load_rows(q, D, qh, d.C, Tq, D, scale);
        load_cols(qt, ldq, qh, d.C, Tq, D, scale);
        load_rows(g, D, gh, OC, Tq, D);
        load_cols(gt, ldq, gh, OC, Tq, D);
        for (int64_t i = 0; i < Tq; ++i) {
          float acc = 0;
          for (int64_t c = 0; c < D; ++c) acc += g[i * D + c] * load(oh[i * OC + c]);
          drow[i] = acc;
        }
        std::fill(dqt, dqt + D * ldq, 0.f);
        const float* lh = lse + (b * d.Hq + h) * Tq;
        bool any = false;
        for (int64_t k0 = 0; k0 < Tk; k0 += kBlock)
          for (int64_t q0 = 0; q0 < Tq; q0 += kBlock) {
            const int64_t kn = std::min(kBlock, Tk - k0), qn = std::min(kBlock, Tq - q0);
            const Tile kind = mk.tile(b, q0, qn, k0, kn);
            if (kind == Tile::None) continue;
            any = true;
            tile_gemm(kn, qn, D, k + k0 * D, D, qt + q0, ldq, st, kBlock, false);
            tile_gemm(kn, qn, D, v + k0 * D, D, gt + q0, ldq, dpt, kBlock, false);
            for (int64_t j = 0; j < kn; ++j)
              for (int64_t i = 0; i < qn; ++i) {
                float& sv = st[j * kBlock + i];
                float& dp = dpt[j * kBlock + i];
                if (kind == Tile::Masked && !mk.visible(b, q0 + i, k0 + j)) {
                  sv = dp = 0.f;
                  continue;
                }
                if (cap > 0.f) {  // d(cap tanh(s / cap)) / ds = 1 - tanh^2
                  const float t = std::tanh(sv / cap);
                  sv = softmax::fast_exp(cap * t - lh[q0 + i]);
                  dp = sv * (dp - drow[q0 + i]) * (1.f - t * t);
                  continue;
                }
                sv = softmax::fast_exp(sv - lh[q0 + i]);
                dp = sv * (dp - drow[q0 + i]);
              }
            tile_gemm(kn, D, qn, st, kBlock, g + q0 * D, D, dv + k0 * D, D, true);
            tile_gemm(kn, D, qn, dpt, kBlock, q + q0 * D, D, dk + k0 * D, D, true);
            tile_gemm(D, qn, kn, kt + k0, ldk, dpt, kBlock, dqt + q0, ldq, true);
          }
        if (!any) continue;
        float* dqh = dq + b * Tq * OC + h * D;
        for (int64_t i = 0; i < Tq; ++i)
          for (int64_t c = 0; c < D; ++c) dqh[i * OC + c] += scale * dqt[c * ldq + i];
      }
      float* dkb = dkv + b * Tk * d.KC + kvh * D;
      float* dvb = dkv + b * Tk * d.KC + (d.Hkv + kvh) * D;
      for (int64_t j = 0; j < Tk; ++j)
        for (int64_t c = 0; c < D; ++c) {
          dkb[j * d.KC + c] += dk[j * D + c];
          dvb[j * d.KC + c] += dv[j * D + c];
        }
    }
  });
}

Mask mask_of(const Tensor& qpos, const Tensor& kpos, int64_t window, const Tensor& qstart) {
  return {qpos.data<int32_t>(), kpos.data<int32_t>(), window,
          qstart.defined() ? qstart.data<int32_t>() : nullptr, qpos.dim(0)};
}

}  // namespace

void attention_block_forward(Tensor out, Tensor lse, const Tensor& qkv, const Tensor& kv,
                             const Tensor& qpos, const Tensor& kpos, int64_t n_q_heads,
                             int64_t n_kv_heads, int64_t window, const Tensor& qstart, float scale,
                             float softcap) {
  const Dims d = dims_of(qkv, kv, n_q_heads, n_kv_heads, scale, softcap);
  const Mask mk = mask_of(qpos, kpos, window, qstart);
  if (qkv.dtype() == DType::F32)
    forward_impl(out.data<float>(), lse.data<float>(), qkv.data<float>(), kv.data<float>(), mk, d);
  else
    forward_impl(out.data<float>(), lse.data<float>(), qkv.data<bf16>(), kv.data<bf16>(), mk, d);
}

void attention_block_backward(Tensor dq, Tensor dkv, const Tensor& dout, const Tensor& out,
                              const Tensor& lse, const Tensor& qkv, const Tensor& kv,
                              const Tensor& qpos, const Tensor& kpos, int64_t n_q_heads,
                              int64_t n_kv_heads, int64_t window, const Tensor& qstart, float scale,
                              float softcap) {
  const Dims d = dims_of(qkv, kv, n_q_heads, n_kv_heads, scale, softcap);
  const Mask mk = mask_of(qpos, kpos, window, qstart);
  if (qkv.dtype() == DType::F32)
    backward_impl(dq.data<float>(), dkv.data<float>(), dout.data<float>(), out.data<float>(),
                  lse.data<float>(), qkv.data<float>(), kv.data<float>(), mk, d);
  else
    backward_impl(dq.data<float>(), dkv.data<float>(), dout.data<bf16>(), out.data<bf16>(),
                  lse.data<float>(), qkv.data<bf16>(), kv.data<bf16>(), mk, d);
}

}  // namespace nk::ops::NK_CPU_NS
