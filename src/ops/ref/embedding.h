// Reference token + position embedding. tok i32[B,T]; wte F[V,C]; wpe F[maxT,C]
// or nullptr; out F[B,T,C]. Ids are assumed valid (the op checks them).
#pragma once
#include <cstdint>

namespace nk::ref {

template <typename F>
void embedding_forward(F* out, const int32_t* tok, const F* wte, const F* wpe, int64_t B, int64_t T,
                       int64_t C) {
  for (int64_t n = 0; n < B * T; ++n) {
    const F* e = wte + int64_t(tok[n]) * C;
    const F* p = wpe ? wpe + (n % T) * C : nullptr;
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = e[c] + (p ? p[c] : F(0));
  }
}

// dwte[tok[n],:] += dout[n,:]; dwpe[t,:] += sum_b dout[b,t,:] (dwpe may be nullptr).
template <typename F>
void embedding_backward(F* dwte, F* dwpe, const F* dout, const int32_t* tok, int64_t B, int64_t T,
                        int64_t C) {
  for (int64_t n = 0; n < B * T; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      dwte[int64_t(tok[n]) * C + c] += dout[n * C + c];
      if (dwpe) dwpe[(n % T) * C + c] += dout[n * C + c];
    }
  }
}

}  // namespace nk::ref
