// AdamW kernel over flat f32 buffers (arguments checked by ops/adamw.cc), one
// pass (PyTorch semantics), optionally writing the new params in the compute
// dtype at the same time.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"
#include "ops/ops.h"

namespace nk::ops::cpu {
namespace {

struct AdamConsts {
  float lr, b1, b2, eps, decay, rbc1, rbc2_sqrt, gs;
};

[[maybe_unused]] float adamw_one(float* p, const float* g, float* m, float* v, int64_t i,
                                 const AdamConsts& k) {
  float gi = g[i] * k.gs;
  float mi = k.b1 * m[i] + (1.f - k.b1) * gi;
  float vi = k.b2 * v[i] + (1.f - k.b2) * gi * gi;
  // mhat / (sqrt(vhat) + eps) with mhat = m rbc1, sqrt(vhat) = sqrt(v) rbc2_sqrt.
  float pi = p[i] * k.decay - k.lr * (mi * k.rbc1) / (std::sqrt(vi) * k.rbc2_sqrt + k.eps);
  m[i] = mi;
  v[i] = vi;
  p[i] = pi;
  return pi;
}

// Elements [b, e). GCC will not vectorize sqrtf without -fno-math-errno, so the
// AVX-512 path spells the update out; its tail is masked so every element takes
// the same instructions whatever the chunking (bit-identical for any thread count).
void adamw_range(float* p, const float* g, float* m, float* v, int64_t b, int64_t e,
                 const AdamConsts& k) {
#ifdef __AVX512F__
  const __m512 gs = _mm512_set1_ps(k.gs), b1 = _mm512_set1_ps(k.b1), b2 = _mm512_set1_ps(k.b2);
  const __m512 c1 = _mm512_set1_ps(1.f - k.b1), c2 = _mm512_set1_ps(1.f - k.b2);
  const __m512 decay = _mm512_set1_ps(k.decay), lr = _mm512_set1_ps(k.lr);
  const __m512 rbc1 = _mm512_set1_ps(k.rbc1), rbc2 = _mm512_set1_ps(k.rbc2_sqrt);
  const __m512 eps = _mm512_set1_ps(k.eps);
  for (int64_t i = b; i < e; i += 16) {
    const __mmask16 mk = e - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (e - i)) - 1);
    __m512 gi = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, g + i), gs);
    __m512 mi = _mm512_fmadd_ps(b1, _mm512_maskz_loadu_ps(mk, m + i), _mm512_mul_ps(c1, gi));
    __m512 vi = _mm512_fmadd_ps(b2, _mm512_maskz_loadu_ps(mk, v + i),
                                _mm512_mul_ps(_mm512_mul_ps(c2, gi), gi));
    __m512 den = _mm512_fmadd_ps(_mm512_mask_sqrt_ps(vi, mk, vi), rbc2, eps);
    __m512 step = _mm512_div_ps(_mm512_mul_ps(lr, _mm512_mul_ps(mi, rbc1)), den);
    __m512 pi = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(mk, p + i), decay, step);
    _mm512_mask_storeu_ps(m + i, mk, mi);
    _mm512_mask_storeu_ps(v + i, mk, vi);
    _mm512_mask_storeu_ps(p + i, mk, pi);
  }
#else
  for (int64_t i = b; i < e; ++i) adamw_one(p, g, m, v, i, k);
#endif
}

// copy == nullptr: no compute-dtype copy. Work goes in L1-sized blocks so the
// copy re-reads params from cache.
template <typename C>
void adamw_kernel(float* p, const float* g, float* m, float* v, C* copy, int64_t n,
                  const AdamConsts& k) {
  constexpr int64_t kBlock = 1024;
  parallel_for(n, 1 << 15, [&](int64_t b, int64_t e) {
    for (int64_t s = b; s < e; s += kBlock) {
      const int64_t t = std::min(e, s + kBlock);
      adamw_range(p, g, m, v, s, t, k);
      if (copy)
        for (int64_t i = s; i < t; ++i) copy[i] = store<C>(p[i]);
    }
  });
}

}  // namespace

void adamw_step(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWParams& p,
                Tensor param_copy) {
  // Bias corrections in double: 1 - b2^t is tiny early and needs the digits.
  const double bc1 = 1.0 - std::pow(double(p.beta1), double(p.step));
  const double bc2 = 1.0 - std::pow(double(p.beta2), double(p.step));
  AdamConsts k{p.lr,
               p.beta1,
               p.beta2,
               p.eps,
               float(1.0 - double(p.lr) * double(p.weight_decay)),
               float(1.0 / bc1),
               float(1.0 / std::sqrt(bc2)),
               p.grad_scale};
  float *pp = param.data<float>(), *pm = m.data<float>(), *pv = v.data<float>();
  const float* pg = grad.data<float>();
  const int64_t n = param.numel();
  if (!param_copy.defined()) {
    adamw_kernel<float>(pp, pg, pm, pv, nullptr, n, k);
    return;
  }
  dispatch_float(param_copy.dtype(), "adamw_step", [&](auto tag) {
    adamw_kernel(pp, pg, pm, pv, param_copy.data<decltype(tag)>(), n, k);
  });
}

}  // namespace nk::ops::cpu
