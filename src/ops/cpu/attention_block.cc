// Attention of local queries to one key/value block (ops.h), the ring
// attention step of context parallelism. Plain loops over each query row and
// the keys it sees (fp32 accumulation), not tiled: correct first; the
// causal attention of one process (attention.cc) is the tuned kernel.
//
// Forward: one task per (batch, query head, query row): the block's scores
// of the visible keys, their max m and sum l, the block's output o / l and
// lse_b = m + log l, merged into the running (out, lse):
//   lse' = log(e^lse + e^lse_b),  out' = out e^(lse - lse') + (o / l) e^(lse_b - lse').
// Backward: one task per (batch, kv head), the only writer of that head's dk
// and dv and of the dq of its query heads (deterministic, no atomics):
//   P = exp(S - lse), dV += P^T dO, dS = P (dO V^T - Drow), dQ += dS K s, dK += dS^T Q s
// with Drow_i = dO_i . O_i over the final output and s = 1/sqrt(D).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"

namespace nk::ops::cpu {
namespace {

struct Dims {
  int64_t B, Tq, Tk, Hq, Hkv, D, C, KC;  // C: qkv's row width, KC: kv's (2 Hkv D)
  int64_t group() const { return Hq / Hkv; }
};

Dims dims_of(const Tensor& qkv, const Tensor& kv, int64_t hq, int64_t hkv) {
  const int64_t c = qkv.dim(2);
  return {qkv.dim(0), qkv.dim(1), kv.dim(1), hq, hkv, c / (hq + 2 * hkv), c, kv.dim(2)};
}

// Query position qp sees key position kp.
inline bool visible(int32_t qp, int32_t kp, int64_t window) {
  return kp <= qp && (window == 0 || int64_t(qp) - kp < window);
}

// Grow-only per-thread scratch.
float* scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

template <typename T>
float dot(const float* a, const T* b, int64_t n) {
  float s = 0;
  for (int64_t c = 0; c < n; ++c) s += a[c] * load(b[c]);
  return s;
}

template <typename T>
void forward_impl(float* out, float* lse, const T* qkv, const T* kv, const int32_t* qpos,
                  const int32_t* kpos, const Dims d, int64_t window) {
  const int64_t D = d.D;
  const float scale = 1.f / std::sqrt(float(D));
  parallel_for(d.B * d.Hq * d.Tq, 16, [&](int64_t begin, int64_t end) {
    float* q = scratch(size_t(2 * D + d.Tk));
    float* o = q + D;
    float* s = o + D;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task % d.Tq, h = task / d.Tq % d.Hq, b = task / d.Tq / d.Hq;
      const int64_t kvh = h / d.group();
      const T* qrow = qkv + (b * d.Tq + i) * d.C + h * D;
      for (int64_t c = 0; c < D; ++c) q[c] = scale * load(qrow[c]);
      const T* kb = kv + b * d.Tk * d.KC + kvh * D;
      const T* vb = kv + b * d.Tk * d.KC + (d.Hkv + kvh) * D;
      float m = -INFINITY;
      for (int64_t j = 0; j < d.Tk; ++j) {
        s[j] = visible(qpos[i], kpos[j], window) ? dot(q, kb + j * d.KC, D) : -INFINITY;
        m = std::max(m, s[j]);
      }
      if (m == -INFINITY) continue;  // no visible key in this block
      std::fill(o, o + D, 0.f);
      float l = 0;
      for (int64_t j = 0; j < d.Tk; ++j) {
        if (s[j] == -INFINITY) continue;
        const float p = std::exp(s[j] - m);
        l += p;
        const T* v = vb + j * d.KC;
        for (int64_t c = 0; c < D; ++c) o[c] += p * load(v[c]);
      }
      const float lse_b = m + std::log(l);
      float& run = lse[(b * d.Hq + h) * d.Tq + i];
      const float hi = std::max(run, lse_b);
      const float merged = hi + std::log(std::exp(run - hi) + std::exp(lse_b - hi));
      const float keep = run == -INFINITY ? 0.f : std::exp(run - merged);
      const float add = std::exp(lse_b - merged) / l;
      float* dst = out + (b * d.Tq + i) * d.Hq * D + h * D;
      for (int64_t c = 0; c < D; ++c) dst[c] = dst[c] * keep + o[c] * add;
      run = merged;
    }
  });
}

template <typename T>
void backward_impl(float* dq, float* dkv, const T* dout, const T* out, const float* lse,
                   const T* qkv, const T* kv, const int32_t* qpos, const int32_t* kpos,
                   const Dims d, int64_t window) {
  const int64_t D = d.D, OC = d.Hq * D;
  const float scale = 1.f / std::sqrt(float(D));
  parallel_for(d.B * d.Hkv, 1, [&](int64_t begin, int64_t end) {
    float* q = scratch(size_t(3 * D));
    float* g = q + D;
    float* dqi = g + D;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kvh = task % d.Hkv, b = task / d.Hkv;
      const T* kb = kv + b * d.Tk * d.KC + kvh * D;
      const T* vb = kv + b * d.Tk * d.KC + (d.Hkv + kvh) * D;
      float* dkb = dkv + b * d.Tk * d.KC + kvh * D;
      float* dvb = dkv + b * d.Tk * d.KC + (d.Hkv + kvh) * D;
      for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h)
        for (int64_t i = 0; i < d.Tq; ++i) {
          const int64_t row = b * d.Tq + i;
          const T* qrow = qkv + row * d.C + h * D;
          const T* grow = dout + row * OC + h * D;
          const T* orow = out + row * OC + h * D;
          float drow = 0;
          for (int64_t c = 0; c < D; ++c) {
            q[c] = scale * load(qrow[c]);
            g[c] = load(grow[c]);
            drow += g[c] * load(orow[c]);
          }
          std::fill(dqi, dqi + D, 0.f);
          const float l = lse[(b * d.Hq + h) * d.Tq + i];
          bool any = false;
          for (int64_t j = 0; j < d.Tk; ++j) {
            if (!visible(qpos[i], kpos[j], window)) continue;
            any = true;
            const T* k = kb + j * d.KC;
            const T* v = vb + j * d.KC;
            const float p = std::exp(dot(q, k, D) - l);
            const float ds = p * (dot(g, v, D) - drow);
            float* dk = dkb + j * d.KC;
            float* dv = dvb + j * d.KC;
            for (int64_t c = 0; c < D; ++c) {
              dv[c] += p * g[c];
              dk[c] += ds * q[c];
              dqi[c] += ds * load(k[c]);
            }
          }
          if (!any) continue;
          float* dst = dq + row * OC + h * D;
          for (int64_t c = 0; c < D; ++c) dst[c] += scale * dqi[c];
        }
    }
  });
}

}  // namespace

void attention_block_forward(Tensor out, Tensor lse, const Tensor& qkv, const Tensor& kv,
                             const Tensor& qpos, const Tensor& kpos, int64_t n_q_heads,
                             int64_t n_kv_heads, int64_t window) {
  const Dims d = dims_of(qkv, kv, n_q_heads, n_kv_heads);
  if (qkv.dtype() == DType::F32)
    forward_impl(out.data<float>(), lse.data<float>(), qkv.data<float>(), kv.data<float>(),
                 qpos.data<int32_t>(), kpos.data<int32_t>(), d, window);
  else
    forward_impl(out.data<float>(), lse.data<float>(), qkv.data<bf16>(), kv.data<bf16>(),
                 qpos.data<int32_t>(), kpos.data<int32_t>(), d, window);
}

void attention_block_backward(Tensor dq, Tensor dkv, const Tensor& dout, const Tensor& out,
                              const Tensor& lse, const Tensor& qkv, const Tensor& kv,
                              const Tensor& qpos, const Tensor& kpos, int64_t n_q_heads,
                              int64_t n_kv_heads, int64_t window) {
  const Dims d = dims_of(qkv, kv, n_q_heads, n_kv_heads);
  if (qkv.dtype() == DType::F32)
    backward_impl(dq.data<float>(), dkv.data<float>(), dout.data<float>(), out.data<float>(),
                  lse.data<float>(), qkv.data<float>(), kv.data<float>(), qpos.data<int32_t>(),
                  kpos.data<int32_t>(), d, window);
  else
    backward_impl(dq.data<float>(), dkv.data<float>(), dout.data<bf16>(), out.data<bf16>(),
                  lse.data<float>(), qkv.data<bf16>(), kv.data<bf16>(), qpos.data<int32_t>(),
                  kpos.data<int32_t>(), d, window);
}

}  // namespace nk::ops::cpu
