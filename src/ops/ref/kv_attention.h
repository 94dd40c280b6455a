// Reference attention of new tokens over a paged KV cache
// (ops::attention_cached): plain loops on raw row-major buffers, for the tests
// (F = float or double). qkv[N, (Hq+2*Hkv)*D]; caches [NB, Hkv, B, D]; block
// table [Q, M]; out[N, Hq*D]. Position p of sequence q is in block
// table[q*M + p/B] at offset p%B. Token n's query head h sees kv head
// h/(Hq/Hkv) of sequence seq[n] at positions 0..pos[n], or with a sliding
// window > 0 at max(0, pos[n] - window + 1)..pos[n]. scale and softcap as
// ref::attention_forward's.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace nk::ref {

struct CacheDims {
  int64_t N, Hq, Hkv, D, B, M;
  const int32_t* table;
  int64_t row() const { return (Hq + 2 * Hkv) * D; }
  int64_t at(int64_t q, int64_t kvh, int64_t pos) const {
    return ((int64_t(table[q * M + pos / B]) * Hkv + kvh) * B + pos % B) * D;
  }
};

template <typename F>
void kv_cache_store(F* k_cache, F* v_cache, const F* qkv, const int32_t* seq, const int32_t* pos,
                    const CacheDims& d) {
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t h = 0; h < d.Hkv; ++h)
      for (int64_t c = 0; c < d.D; ++c) {
        k_cache[d.at(seq[n], h, pos[n]) + c] = qkv[n * d.row() + (d.Hq + h) * d.D + c];
        v_cache[d.at(seq[n], h, pos[n]) + c] = qkv[n * d.row() + (d.Hq + d.Hkv + h) * d.D + c];
      }
}

template <typename F>
void attention_cached(F* out, const F* qkv, const F* k_cache, const F* v_cache, const int32_t* seq,
                      const int32_t* pos, const CacheDims& d, int64_t window = 0, F scale = 0,
                      F softcap = 0) {
  if (scale == F(0)) scale = F(1) / std::sqrt(F(d.D));
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t h = 0; h < d.Hq; ++h) {
      const int64_t kvh = h / (d.Hq / d.Hkv), len = int64_t(pos[n]) + 1;
      const int64_t j0 = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      const F* q = qkv + n * d.row() + h * d.D;
      std::vector<F> s(static_cast<size_t>(len));
      F m = -INFINITY;
      for (int64_t j = j0; j < len; ++j) {
        const F* k = k_cache + d.at(seq[n], kvh, j);
        F acc = 0;
        for (int64_t c = 0; c < d.D; ++c) acc += q[c] * k[c];
        s[j] = acc * scale;
        if (softcap > F(0)) s[j] = softcap * std::tanh(s[j] / softcap);
        m = std::max(m, s[j]);
      }
      F sum = 0;
      for (int64_t j = j0; j < len; ++j) sum += s[j] = std::exp(s[j] - m);
      F* o = out + n * d.Hq * d.D + h * d.D;
      for (int64_t c = 0; c < d.D; ++c) o[c] = 0;
      for (int64_t j = j0; j < len; ++j) {
        const F* v = v_cache + d.at(seq[n], kvh, j);
        for (int64_t c = 0; c < d.D; ++c) o[c] += s[j] / sum * v[c];
      }
    }
}

}  // namespace nk::ref
