// Reference causal grouped-query attention: plain loops on raw row-major
// buffers, for the tests (F = float or double). Materialises one row of scores
// at a time. Shapes: qkv[B,T,(Hq+2*Hkv)*D] packs per token [q heads | k heads |
// v heads]; out[B,T,Hq*D]; lse[B,Hq,T]. Query head h reads kv head h/(Hq/Hkv).
//
// Packed rows: cu (optional) is i32[B, n_cu] with each row 0 = c_0 <= ... <=
// c_{n_cu-1} = T, the cumulative document starts (see ops::attention_forward).
// Token t then attends only to s with doc_start(t) <= s <= t. A sliding
// window > 0 also requires s > t - window (0: no window).
//
// scale: the scores' factor (0: 1/sqrt(D)); softcap > 0: each scaled score s
// becomes softcap tanh(s / softcap) (Gemma 2), whose derivative 1 - tanh^2
// the backward applies to dS.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace nk::ref {

struct AttentionDims {
  int64_t B, T, Hq, Hkv, D;
  int64_t row() const { return (Hq + 2 * Hkv) * D; }  // qkv elements per token
  int64_t q_off(int64_t h) const { return h * D; }
  int64_t k_off(int64_t h) const { return (Hq + h / (Hq / Hkv)) * D; }  // for query head h
  int64_t v_off(int64_t h) const { return (Hq + Hkv + h / (Hq / Hkv)) * D; }
};

// First token of the document holding token t of a row (0 without cu): the
// largest c_k <= t, by a linear scan.
inline int64_t doc_start(const int32_t* cu_row, int64_t n_cu, int64_t t) {
  int64_t start = 0;
  for (int64_t k = 0; k < n_cu; ++k)
    if (cu_row && cu_row[k] <= t) start = cu_row[k];
  return start;
}

// First key token t sees: its document's start, or later under a window.
inline int64_t first_key(const int32_t* cu_row, int64_t n_cu, int64_t t, int64_t window) {
  const int64_t start = doc_start(cu_row, n_cu, t);
  return window > 0 ? std::max(start, t - window + 1) : start;
}

// out = softmax(scale * q k^T, causal) v; lse = logsumexp of the scaled scores.
template <typename F>
void attention_forward(F* out, F* lse, const F* qkv, const AttentionDims& d,
                       const int32_t* cu = nullptr, int64_t n_cu = 0, int64_t window = 0,
                       F scale = 0, F softcap = 0) {
  if (scale == F(0)) scale = F(1) / std::sqrt(F(d.D));
  std::vector<F> s(d.T);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h)
      for (int64_t i = 0; i < d.T; ++i) {
        const F* q = qkv + (b * d.T + i) * d.row() + d.q_off(h);
        const int64_t j0 = first_key(cu ? cu + b * n_cu : nullptr, n_cu, i, window);
        F m = -INFINITY;
        for (int64_t j = j0; j <= i; ++j) {
          const F* k = qkv + (b * d.T + j) * d.row() + d.k_off(h);
          F acc = 0;
          for (int64_t c = 0; c < d.D; ++c) acc += q[c] * k[c];
          s[j] = acc * scale;
          if (softcap > F(0)) s[j] = softcap * std::tanh(s[j] / softcap);
          m = std::max(m, s[j]);
        }
        F sum = 0;
        for (int64_t j = j0; j <= i; ++j) sum += std::exp(s[j] - m);
        const F l = m + std::log(sum);
        lse[(b * d.Hq + h) * d.T + i] = l;
        F* o = out + (b * d.T + i) * d.Hq * d.D + h * d.D;
        for (int64_t c = 0; c < d.D; ++c) o[c] = 0;
        for (int64_t j = j0; j <= i; ++j) {
          const F p = std::exp(s[j] - l);
          const F* v = qkv + (b * d.T + j) * d.row() + d.v_off(h);
          for (int64_t c = 0; c < d.D; ++c) o[c] += p * v[c];
        }
      }
}

// dqkv (written) from dout[B,T,Hq*D], using the saved out and lse:
// P = exp(S - lse), dP = dO V^T, dS = P (dP - rowsum(dO * O)),
// dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
template <typename F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* out, const F* lse,
                        const AttentionDims& d, const int32_t* cu = nullptr, int64_t n_cu = 0,
                        int64_t window = 0, F scale = 0, F softcap = 0) {
  if (scale == F(0)) scale = F(1) / std::sqrt(F(d.D));
  for (int64_t i = 0; i < d.B * d.T * d.row(); ++i) dqkv[i] = 0;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h)
      for (int64_t i = 0; i < d.T; ++i) {
        const int64_t qi = (b * d.T + i) * d.row(), oi = (b * d.T + i) * d.Hq * d.D + h * d.D;
        const F* q = qkv + qi + d.q_off(h);
        F* dq = dqkv + qi + d.q_off(h);
        F di = 0;
        for (int64_t c = 0; c < d.D; ++c) di += dout[oi + c] * out[oi + c];
        for (int64_t j = first_key(cu ? cu + b * n_cu : nullptr, n_cu, i, window); j <= i; ++j) {
          const int64_t kj = (b * d.T + j) * d.row();
          const F* k = qkv + kj + d.k_off(h);
          const F* v = qkv + kj + d.v_off(h);
          F s = 0, dp = 0;
          for (int64_t c = 0; c < d.D; ++c) {
            s += q[c] * k[c];
            dp += dout[oi + c] * v[c];
          }
          F sc = s * scale, cap_grad = 1;
          if (softcap > F(0)) {
            const F t = std::tanh(sc / softcap);
            sc = softcap * t;
            cap_grad = F(1) - t * t;
          }
          const F p = std::exp(sc - lse[(b * d.Hq + h) * d.T + i]);
          const F ds = p * (dp - di) * cap_grad * scale;
          for (int64_t c = 0; c < d.D; ++c) {
            dq[c] += ds * k[c];
            dqkv[kj + d.k_off(h) + c] += ds * q[c];
            dqkv[kj + d.v_off(h) + c] += p * dout[oi + c];
          }
        }
      }
}

}  // namespace nk::ref
