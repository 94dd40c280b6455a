// Token + position embedding kernels (arguments checked by ops/embedding.cc):
// tokens i32[B,T]; wte T[V,C]; wpe T[maxT,C]; out T[B,T,C]. The backward
// scatters without atomics: dwte is split by columns and dwpe by positions (by
// columns when explicit position ids are given), so every element is summed by
// one task in row order.
#include <algorithm>

#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"

namespace nk::ops::NK_CPU_NS {
namespace {

struct EmbDims {
  int64_t B, T, C, V;
  int64_t v0 = 0;  // the first id of a vocabulary shard: ids outside [v0, v0 + V) read zeros
};

// pos: explicit position per token [B*T], or nullptr for n % T.
template <typename T>
void embedding_fwd(T* out, const int32_t* tok, const T* wte, const T* wpe, const int32_t* pos,
                   const EmbDims& d) {
  const int64_t C = d.C;
  parallel_for(d.B * d.T, std::max<int64_t>(1, 8192 / std::max<int64_t>(C, 1)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t n = r0; n < r1; ++n) {
                   const int64_t id = int64_t(tok[n]) - d.v0;
                   T* o = out + n * C;
                   if (id < 0 || id >= d.V) {  // another shard's token
                     const T* p = wpe ? wpe + (pos ? int64_t(pos[n]) : n % d.T) * C : nullptr;
                     for (int64_t c = 0; c < C; ++c) o[c] = p ? p[c] : store<T>(0.f);
                     continue;
                   }
                   const T* e = wte + id * C;
                   if (wpe) {
                     const T* p = wpe + (pos ? int64_t(pos[n]) : n % d.T) * C;
                     for (int64_t c = 0; c < C; ++c) o[c] = store<T>(load(e[c]) + load(p[c]));
                   } else {
                     for (int64_t c = 0; c < C; ++c) o[c] = e[c];
                   }
                 }
               });
}

// dwte or dwpe nullptr: not computed.
template <typename T>
void embedding_bwd(float* dwte, float* dwpe, const T* dout, const int32_t* tok, const int32_t* pos,
                   const EmbDims& d) {
  const int64_t N = d.B * d.T, C = d.C;
  // Columns split across tasks; each column sums its rows in token order.
  if (dwte || (dwpe && pos))
    parallel_for(C, 64, [&](int64_t c0, int64_t c1) {
      for (int64_t n = 0; n < N; ++n) {
        const T* o = dout + n * C;
        if (const int64_t id = int64_t(tok[n]) - d.v0; dwte && id >= 0 && id < d.V) {
          float* g = dwte + id * C;
          for (int64_t c = c0; c < c1; ++c) g[c] += load(o[c]);
        }
        if (!dwpe || !pos) continue;
        float* gp = dwpe + int64_t(pos[n]) * C;
        for (int64_t c = c0; c < c1; ++c) gp[c] += load(o[c]);
      }
    });
  if (!dwpe || pos) return;
  parallel_for(d.T, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t b = 0; b < d.B; ++b) {
        const T* o = dout + (b * d.T + t) * C;
        for (int64_t c = 0; c < C; ++c) dwpe[t * C + c] += load(o[c]);
      }
    }
  });
}

// Explicit position ids i32[B,T], checked against the wpe rows; nullptr if undefined.
const int32_t* check_positions(const char* op, const Tensor& positions, const EmbDims& d,
                               int64_t max_t) {
  if (!positions.defined()) return nullptr;
  const int32_t* pos = positions.data<int32_t>();
  for (int64_t n = 0; n < d.B * d.T; ++n)
    if (pos[n] < 0 || pos[n] >= max_t)
      fail("{}: position id {} at (batch {}, t {}) is outside [0, max_seq_len = {})", op, pos[n],
           n / d.T, n % d.T, max_t);
  return pos;
}

}  // namespace

void embedding_forward(Tensor out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& positions, int64_t vocab_start) {
  const EmbDims d{tokens.dim(0), tokens.dim(1), wte.dim(1), wte.dim(0),
                  std::max<int64_t>(vocab_start, 0)};
  // Token ids come from data files: a bad one is the user's error, not ours
  // (a shard sees ids of the whole vocabulary: only negative ones are wrong).
  const int32_t* tok = tokens.data<int32_t>();
  for (int64_t n = 0; n < d.B * d.T; ++n) {
    if (tok[n] < 0 || (vocab_start < 0 && tok[n] >= d.V))
      fail(
          "embedding: token id {} at position {} (batch {}, t {}) is outside the vocabulary "
          "[0, {})",
          tok[n], n, n / d.T, n % d.T, d.V);
  }
  dispatch_float(wte.dtype(), "embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    embedding_fwd(
        out.data<T>(), tok, wte.data<T>(), wpe.defined() ? wpe.data<T>() : nullptr,
        wpe.defined() ? check_positions("embedding_forward", positions, d, wpe.dim(0)) : nullptr,
        d);
  });
}

void embedding_backward(Tensor dwte, Tensor dwpe, const Tensor& dout, const Tensor& tokens,
                        const Tensor& positions, int64_t vocab_start) {
  // V is only known (and only needed, to index dwte) when dwte is computed.
  const EmbDims d{tokens.dim(0), tokens.dim(1), dout.dim(2), dwte.defined() ? dwte.dim(0) : 0,
                  std::max<int64_t>(vocab_start, 0)};
  const int32_t* tok = tokens.data<int32_t>();
  for (int64_t n = 0; dwte.defined() && vocab_start < 0 && n < d.B * d.T; ++n)
    NK_CHECK(tok[n] >= 0 && tok[n] < d.V, "embedding_backward: token {} at {} outside [0, {})",
             tok[n], n, d.V);
  dispatch_float(dout.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    embedding_bwd(
        dwte.defined() ? dwte.data<float>() : nullptr,
        dwpe.defined() ? dwpe.data<float>() : nullptr, dout.data<T>(), tok,
        dwpe.defined() ? check_positions("embedding_backward", positions, d, dwpe.dim(0)) : nullptr,
        d);
  });
}

}  // namespace nk::ops::NK_CPU_NS
