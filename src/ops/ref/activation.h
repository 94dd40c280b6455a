// Reference activations over n values: GELU (tanh form), SiLU, ReLU and SwiGLU over a fused
// [gate | up] input gu F[N,2F'] -> y F[N,F'].
#pragma once
#include <cmath>
#include <cstdint>

namespace nk::ref {

// y = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi).
template <typename F>
F gelu(F x) {
  const F k = F(0.7978845608028654);
  return F(0.5) * x * (F(1) + std::tanh(k * (x + F(0.044715) * x * x * x)));
}

template <typename F>
F gelu_grad(F x) {
  const F k = F(0.7978845608028654);
  F t = std::tanh(k * (x + F(0.044715) * x * x * x));
  F du = k * (F(1) + F(3 * 0.044715) * x * x);
  return F(0.5) * (F(1) + t) + F(0.5) * x * (F(1) - t * t) * du;
}

template <typename F>
void gelu_forward(F* y, const F* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu(x[i]);
}

// dx = dy * gelu'(x) (written).
template <typename F>
void gelu_backward(F* dx, const F* dy, const F* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * gelu_grad(x[i]);
}

template <typename F>
F sigmoid(F x) {
  return F(1) / (F(1) + std::exp(-x));
}

// silu(x) = x sigmoid(x); silu'(x) = s + x s (1 - s).
template <typename F>
F silu(F x) {
  return x * sigmoid(x);
}

template <typename F>
F silu_grad(F x) {
  F s = sigmoid(x);
  return s + x * s * (F(1) - s);
}

// relu(x) = max(x, 0); relu'(0) = 0, as PyTorch has it.
template <typename F>
F relu(F x) {
  return x > F(0) ? x : F(0);
}

template <typename F>
F relu_grad(F x) {
  return x > F(0) ? F(1) : F(0);
}

// y[n,f] = silu(gu[n,f]) * gu[n,Fh+f], silu(g) = g sigmoid(g); Fh = hidden width.
template <typename F>
void swiglu_forward(F* y, const F* gu, int64_t N, int64_t Fh) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t f = 0; f < Fh; ++f) {
      F g = gu[n * 2 * Fh + f], u = gu[n * 2 * Fh + Fh + f];
      y[n * Fh + f] = g * sigmoid(g) * u;
    }
  }
}

// dgu (written): d gate = dy u silu'(g), silu'(g) = s (1 + g (1 - s)); d up = dy silu(g).
template <typename F>
void swiglu_backward(F* dgu, const F* dy, const F* gu, int64_t N, int64_t Fh) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t f = 0; f < Fh; ++f) {
      F g = gu[n * 2 * Fh + f], u = gu[n * 2 * Fh + Fh + f], d = dy[n * Fh + f];
      F s = sigmoid(g);
      dgu[n * 2 * Fh + f] = d * u * s * (F(1) + g * (F(1) - s));
      dgu[n * 2 * Fh + Fh + f] = d * g * s;
    }
  }
}

// GeGLU (Gemma): y[n,f] = gelu(g) u with the tanh GELU; dgu written.
template <typename F>
void geglu_forward(F* y, const F* gu, int64_t N, int64_t Fh) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < Fh; ++f)
      y[n * Fh + f] = gelu(gu[n * 2 * Fh + f]) * gu[n * 2 * Fh + Fh + f];
}

template <typename F>
void geglu_backward(F* dgu, const F* dy, const F* gu, int64_t N, int64_t Fh) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < Fh; ++f) {
      F g = gu[n * 2 * Fh + f], u = gu[n * 2 * Fh + Fh + f], d = dy[n * Fh + f];
      dgu[n * 2 * Fh + f] = d * u * gelu_grad(g);
      dgu[n * 2 * Fh + Fh + f] = d * gelu(g);
    }
}

// Soft-capping: y = cap tanh(x / cap); dx = dy (1 - tanh^2(x / cap)).
template <typename F>
F softcap(F x, F cap) {
  return cap * std::tanh(x / cap);
}

template <typename F>
F softcap_grad(F x, F cap) {
  const F t = std::tanh(x / cap);
  return F(1) - t * t;
}

}  // namespace nk::ref
