// Token + position embedding: tokens i32[B,T]; wte T[V,C]; wpe T[maxT,C]; out
// T[B,T,C]. The backward scatters without atomics: dwte is split by columns and
// dwpe by positions (by columns when explicit position ids are given), so every
// element is summed by one task in row order.
#include <algorithm>

#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/ops.h"

namespace nk::ops {
namespace {

using cpu::check_cpu;
using cpu::dispatch_float;
using cpu::load;
using cpu::store;

struct EmbDims {
  int64_t B, T, C, V;
};

EmbDims check_tokens(const char* op, const Tensor& tokens, const Tensor& table) {
  check_cpu(tokens, op, "tokens");
  check_cpu(table, op, "wte");
  check_dtype(tokens, DType::I32, "tokens");
  NK_CHECK(tokens.ndim() == 2, "{}: tokens {} is not [B, T]", op, tokens.desc());
  NK_CHECK(table.ndim() == 2, "{}: wte {} is not [V, C]", op, table.desc());
  return {tokens.dim(0), tokens.dim(1), table.dim(1), table.dim(0)};
}

// pos: explicit position per token [B*T], or nullptr for n % T.
template <typename T>
void embedding_fwd(T* out, const int32_t* tok, const T* wte, const T* wpe, const int32_t* pos,
                   const EmbDims& d) {
  const int64_t C = d.C;
  parallel_for(d.B * d.T, std::max<int64_t>(1, 8192 / std::max<int64_t>(C, 1)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t n = r0; n < r1; ++n) {
                   const T* e = wte + int64_t(tok[n]) * C;
                   T* o = out + n * C;
                   if (wpe) {
                     const T* p = wpe + (pos ? int64_t(pos[n]) : n % d.T) * C;
                     for (int64_t c = 0; c < C; ++c) o[c] = store<T>(load(e[c]) + load(p[c]));
                   } else {
                     for (int64_t c = 0; c < C; ++c) o[c] = e[c];
                   }
                 }
               });
}

template <typename T>
void embedding_bwd(float* dwte, float* dwpe, const T* dout, const int32_t* tok, const int32_t* pos,
                   const EmbDims& d) {
  const int64_t N = d.B * d.T, C = d.C;
  // Columns split across tasks; each column sums its rows in token order.
  parallel_for(C, 64, [&](int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < N; ++n) {
      const T* o = dout + n * C;
      if (dwte) {
        float* g = dwte + int64_t(tok[n]) * C;
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
  check_cpu(positions, op, "positions");
  check_dtype(positions, DType::I32, "positions");
  check_shape(positions, {d.B, d.T}, "positions");
  const int32_t* pos = positions.data<int32_t>();
  for (int64_t n = 0; n < d.B * d.T; ++n)
    if (pos[n] < 0 || pos[n] >= max_t)
      fail("{}: position id {} at (batch {}, t {}) is outside [0, max_seq_len = {})", op, pos[n],
           n / d.T, n % d.T, max_t);
  return pos;
}

}  // namespace

void embedding_forward(Tensor out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& positions) {
  EmbDims d = check_tokens("embedding_forward", tokens, wte);
  check_cpu(out, "embedding_forward", "out");
  check_shape(out, {d.B, d.T, d.C}, "out");
  check_dtype(out, wte.dtype(), "out");
  if (wpe.defined()) {
    check_cpu(wpe, "embedding_forward", "wpe");
    NK_CHECK(wpe.ndim() == 2 && wpe.dim(1) == d.C && wpe.dim(0) >= d.T,
             "embedding_forward: wpe {} does not cover T={} C={}", wpe.desc(), d.T, d.C);
    check_dtype(wpe, wte.dtype(), "wpe");
  }
  // Token ids come from data files: a bad one is the user's error, not ours.
  const int32_t* tok = tokens.data<int32_t>();
  for (int64_t n = 0; n < d.B * d.T; ++n) {
    if (tok[n] < 0 || tok[n] >= d.V)
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
                        const Tensor& positions) {
  if (!dwte.defined() && !dwpe.defined()) return;  // both frozen
  // dwte undefined (frozen): the shapes come from dwpe, which has C columns too.
  EmbDims d = check_tokens("embedding_backward", tokens, dwte.defined() ? dwte : dwpe);
  if (dwte.defined()) check_dtype(dwte, DType::F32, "dwte");
  check_cpu(dout, "embedding_backward", "dout");
  check_shape(dout, {d.B, d.T, d.C}, "dout");
  if (dwpe.defined()) {
    check_cpu(dwpe, "embedding_backward", "dwpe");
    check_dtype(dwpe, DType::F32, "dwpe");
    NK_CHECK(dwpe.ndim() == 2 && dwpe.dim(1) == d.C && dwpe.dim(0) >= d.T,
             "embedding_backward: dwpe {} does not cover T={} C={}", dwpe.desc(), d.T, d.C);
  }
  const int32_t* tok = tokens.data<int32_t>();
  for (int64_t n = 0; dwte.defined() && n < d.B * d.T; ++n)
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

}  // namespace nk::ops
