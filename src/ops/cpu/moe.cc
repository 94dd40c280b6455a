// Mixture-of-Experts routing and token movement kernels (arguments checked
// by ops/moe.cc; semantics in ops/moe.h). The router's per-row arithmetic is
// in double: E is small and the scores decide which experts run.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"
#include "ops/moe.h"

namespace nk::ops::NK_CPU_NS {
namespace {

constexpr int64_t kGrain = 1 << 14;

// Grain in rows for per-row work of `cols` values.
int64_t row_grain(int64_t cols) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1));
}

// logsumexp of one row and, in p, its softmax.
template <typename T>
double softmax_row(const T* l, int64_t E, double* p) {
  double mx = -INFINITY;
  for (int64_t e = 0; e < E; ++e) mx = std::max(mx, double(load(l[e])));
  double s = 0;
  for (int64_t e = 0; e < E; ++e) s += (p[e] = std::exp(double(load(l[e])) - mx));
  for (int64_t e = 0; e < E; ++e) p[e] /= s;
  return mx + std::log(s);
}

// One row's scores (softmax or sigmoid) into p; returns logsumexp(l).
template <typename T>
double scores_row(const T* l, int64_t E, bool sigmoid, double* p) {
  const double lse = softmax_row(l, E, p);
  if (sigmoid)
    for (int64_t e = 0; e < E; ++e) p[e] = 1.0 / (1.0 + std::exp(-double(load(l[e]))));
  return lse;
}

// Per-thread scratch vector `which` of T, n elements: grown once, then reused,
// so that a training step allocates nothing here after the first.
template <typename T>
std::vector<T>& scratch(int which, int64_t n) {
  thread_local std::vector<T> bufs[5];
  std::vector<T>& b = bufs[which];
  b.resize(size_t(n));
  return b;
}

int32_t check_slot(int32_t s, int64_t M, const char* op, int64_t n) {
  if (s < -1 || s >= M) fail("{}: slot {} of row {} is outside [-1, {})", op, s, n, M);
  return s;
}

}  // namespace

void moe_route(Tensor probs, Tensor idx, Tensor weights, Tensor stats, const Tensor& logits,
               const Tensor& bias, const MoeRouteSpec& spec) {
  const int64_t N = logits.dim(0), E = logits.dim(1), k = idx.dim(1);
  const int64_t S = stats.ndim() == 2 ? stats.dim(0) : 1, rows_per_seg = N / S;
  const bool sigmoid = spec.sigmoid;
  float* P = probs.data<float>();
  int32_t* I = idx.data<int32_t>();
  float* W = weights.data<float>();
  std::vector<double>& lse = scratch<double>(0, N);
  // The choice's bias, read once (f32 or the logits' dtype).
  std::vector<double>& bias_d = scratch<double>(3, E);
  std::fill(bias_d.begin(), bias_d.end(), 0.0);
  if (bias.defined())
    dispatch_float(bias.dtype(), "moe_route", [&](auto tag) {
      using B = decltype(tag);
      for (int64_t e = 0; e < E; ++e) bias_d[size_t(e)] = double(load(bias.data<B>()[e]));
    });
  const int64_t G = spec.n_group, per_group = E / G;
  dispatch_float(logits.dtype(), "moe_route", [&](auto tag) {
    using T = decltype(tag);
    const T* L = logits.data<T>();
    parallel_for(N, row_grain(E), [&](int64_t r0, int64_t r1) {
      std::vector<double>& p = scratch<double>(1, E);
      std::vector<double>& c = scratch<double>(2, E);
      std::vector<double>& gs = scratch<double>(4, G);
      std::vector<char>& taken = scratch<char>(2, E);
      std::vector<char>& kept = scratch<char>(3, G);
      for (int64_t n = r0; n < r1; ++n) {
        lse[size_t(n)] = scores_row(L + n * E, E, sigmoid, p.data());
        for (int64_t e = 0; e < E; ++e) {
          P[n * E + e] = float(p[size_t(e)]);
          c[size_t(e)] = p[size_t(e)] + bias_d[size_t(e)];
        }
        // Group-limited: the experts of groups not kept are taken already.
        std::fill(taken.begin(), taken.end(), 0);
        if (G > 1) {
          for (int64_t g = 0; g < G; ++g) {
            double m1 = -INFINITY, m2 = -INFINITY;
            for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
              const double v = c[size_t(e)];
              if (v > m1) {
                m2 = m1;
                m1 = v;
              } else if (v > m2) {
                m2 = v;
              }
            }
            gs[size_t(g)] = per_group > 1 ? m1 + m2 : m1;
          }
          std::fill(kept.begin(), kept.end(), 0);
          for (int64_t j = 0; j < spec.topk_group; ++j) {
            int64_t best = -1;
            for (int64_t g = 0; g < G; ++g)
              if (!kept[size_t(g)] && (best < 0 || gs[size_t(g)] > gs[size_t(best)])) best = g;
            kept[size_t(best)] = 1;
          }
          for (int64_t e = 0; e < E; ++e) taken[size_t(e)] = !kept[size_t(e / per_group)];
        }
        double sum = 0;
        for (int64_t j = 0; j < k; ++j) {
          int64_t best = -1;
          for (int64_t e = 0; e < E; ++e)
            if (!taken[size_t(e)] && (best < 0 || c[size_t(e)] > c[size_t(best)])) best = e;
          taken[size_t(best)] = 1;
          I[n * k + j] = int32_t(best);
          sum += p[size_t(best)];
        }
        for (int64_t j = 0; j < k; ++j) {
          const double w = p[size_t(I[n * k + j])];
          W[n * k + j] = float((spec.norm_topk ? w / sum : w) * spec.scaling);
        }
      }
    });
  });
  // The sums in row order, so that they do not depend on the thread count.
  std::vector<double>& acc = scratch<double>(1, S * (E + 1));
  std::fill(acc.begin(), acc.end(), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const float* p = P + n * E;
    double* a = acc.data() + (n / rows_per_seg) * (E + 1);
    double row = 1;
    if (sigmoid) {
      row = 0;
      for (int64_t e = 0; e < E; ++e) row += p[e];
    }
    for (int64_t e = 0; e < E; ++e) a[e] += double(p[e]) / row;
    a[E] += lse[size_t(n)] * lse[size_t(n)];
  }
  float* St = stats.data<float>();
  for (int64_t i = 0; i < S * (E + 1); ++i) St[i] = float(acc[size_t(i)]);
}

void moe_route_backward(Tensor dlogits, const Tensor& dweights, const Tensor& balance_grad,
                        float z_grad, const Tensor& logits, const Tensor& probs, const Tensor& idx,
                        const MoeRouteSpec& spec) {
  const int64_t N = logits.dim(0), E = logits.dim(1), k = idx.dim(1);
  const int64_t S = balance_grad.ndim() == 2 ? balance_grad.dim(0) : 1, rows_per_seg = N / S;
  const bool sigmoid = spec.sigmoid, norm_topk = spec.norm_topk;
  const float *P = probs.data<float>(), *DW = dweights.data<float>(),
              *GB = balance_grad.data<float>();
  const int32_t* I = idx.data<int32_t>();
  dispatch_float(logits.dtype(), "moe_route_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* L = logits.data<T>();
    T* DL = dlogits.data<T>();
    parallel_for(N, row_grain(E), [&](int64_t r0, int64_t r1) {
      std::vector<double>& dp = scratch<double>(0, E);
      std::vector<double>& sm = scratch<double>(1, E);
      for (int64_t n = r0; n < r1; ++n) {
        const float* p = P + n * E;
        const int32_t* sel = I + n * k;
        const float* dw = DW + n * k;
        const float* G = GB + (n / rows_per_seg) * E;
        std::fill(dp.begin(), dp.end(), 0.0);
        // weights w_j = scaling p_sel_j / Z (Z = sum of the selected, or 1).
        double Z = 1, wdw = 0;
        if (norm_topk) {
          Z = 0;
          for (int64_t j = 0; j < k; ++j) Z += p[sel[j]];
          for (int64_t j = 0; j < k; ++j) wdw += spec.scaling * double(dw[j]) * p[sel[j]] / Z;
        }
        for (int64_t j = 0; j < k; ++j) {
          if (sel[j] < 0 || sel[j] >= E) fail("moe_route_backward: expert {} of row {}", sel[j], n);
          dp[size_t(sel[j])] += (spec.scaling * double(dw[j]) - wdw) / Z;
        }
        // The balancing score: p itself (softmax) or p / sum p (sigmoid).
        if (sigmoid) {
          double s = 0, bg = 0;
          for (int64_t e = 0; e < E; ++e) s += p[e];
          for (int64_t e = 0; e < E; ++e) bg += double(p[e]) / s * G[e];
          for (int64_t e = 0; e < E; ++e) dp[size_t(e)] += (double(G[e]) - bg) / s;
        } else {
          for (int64_t e = 0; e < E; ++e) dp[size_t(e)] += G[e];
        }
        const double lse = softmax_row(L + n * E, E, sm.data());
        double pdp = 0;
        if (!sigmoid)
          for (int64_t e = 0; e < E; ++e) pdp += double(p[e]) * dp[size_t(e)];
        for (int64_t e = 0; e < E; ++e) {
          const double pe = p[e];
          double d = sigmoid ? dp[size_t(e)] * pe * (1 - pe) : pe * (dp[size_t(e)] - pdp);
          d += double(z_grad) * 2 * lse * sm[size_t(e)];
          DL[n * E + e] = store<T>(float(d));
        }
      }
    });
  });
}

void moe_gather(Tensor xs, const Tensor& x, const Tensor& src) {
  const int64_t M = xs.dim(0), C = xs.dim(1), N = x.dim(0);
  const int32_t* S = src.data<int32_t>();
  for (int64_t m = 0; m < M; ++m)
    if (S[m] < 0 || S[m] >= N)
      fail("moe_gather: source row {} of slot {} is outside [0, {})", S[m], m, N);
  const size_t bytes = size_t(C) * dtype_size(x.dtype());
  const char* X = static_cast<const char*>(x.raw());
  char* Y = static_cast<char*>(xs.raw());
  parallel_for(M, row_grain(C), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      std::memcpy(Y + size_t(m) * bytes, X + size_t(S[m]) * bytes, bytes);
  });
}

void moe_combine(Tensor y, const Tensor& out, const Tensor& slot, const Tensor& weights) {
  const int64_t N = y.dim(0), C = y.dim(1), k = slot.dim(1), M = out.dim(0);
  const int32_t* S = slot.data<int32_t>();
  const float* W = weights.data<float>();
  for (int64_t i = 0; i < N * k; ++i) check_slot(S[i], M, "moe_combine", i / k);
  dispatch_float(y.dtype(), "moe_combine", [&](auto tag) {
    using T = decltype(tag);
    const T* O = out.data<T>();
    T* Y = y.data<T>();
    parallel_for(N, row_grain(C * k), [&](int64_t r0, int64_t r1) {
      std::vector<float>& acc = scratch<float>(0, C);
      for (int64_t n = r0; n < r1; ++n) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t j = 0; j < k; ++j) {
          const int32_t s = S[n * k + j];
          if (s < 0) continue;
          const float w = W[n * k + j];
          const T* o = O + int64_t(s) * C;
          for (int64_t c = 0; c < C; ++c) acc[size_t(c)] += w * load(o[c]);
        }
        for (int64_t c = 0; c < C; ++c) Y[n * C + c] = store<T>(acc[size_t(c)]);
      }
    });
  });
}

void moe_combine_backward(Tensor dout, Tensor dweights, const Tensor& dy, const Tensor& out,
                          const Tensor& slot, const Tensor& weights) {
  const int64_t N = dy.dim(0), C = dy.dim(1), k = slot.dim(1), M = out.dim(0);
  const int32_t* S = slot.data<int32_t>();
  const float* W = weights.data<float>();
  float* DW = dweights.data<float>();
  for (int64_t i = 0; i < N * k; ++i) check_slot(S[i], M, "moe_combine_backward", i / k);
  dispatch_float(dy.dtype(), "moe_combine_backward", [&](auto tag) {
    using T = decltype(tag);
    const T *O = out.data<T>(), *DY = dy.data<T>();
    T* DO = dout.data<T>();
    parallel_for(N, row_grain(C * k), [&](int64_t r0, int64_t r1) {
      for (int64_t n = r0; n < r1; ++n) {
        const T* d = DY + n * C;
        for (int64_t j = 0; j < k; ++j) {
          const int32_t s = S[n * k + j];
          if (s < 0) {
            DW[n * k + j] = 0.f;
            continue;
          }
          const float w = W[n * k + j];
          const T* o = O + int64_t(s) * C;
          T* g = DO + int64_t(s) * C;
          double dot = 0;
          for (int64_t c = 0; c < C; ++c) {
            const float dv = load(d[c]);
            dot += double(dv) * double(load(o[c]));
            g[c] = store<T>(w * dv);
          }
          DW[n * k + j] = float(dot);
        }
      }
    });
  });
}

void moe_scatter(Tensor dx, const Tensor& dxs, const Tensor& slot) {
  const int64_t N = dx.dim(0), C = dx.dim(1), k = slot.dim(1), M = dxs.dim(0);
  const int32_t* S = slot.data<int32_t>();
  for (int64_t i = 0; i < N * k; ++i) check_slot(S[i], M, "moe_scatter", i / k);
  dispatch_float(dx.dtype(), "moe_scatter", [&](auto tag) {
    using T = decltype(tag);
    const T* G = dxs.data<T>();
    T* D = dx.data<T>();
    parallel_for(N, row_grain(C * k), [&](int64_t r0, int64_t r1) {
      std::vector<float>& acc = scratch<float>(0, C);
      for (int64_t n = r0; n < r1; ++n) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t j = 0; j < k; ++j) {
          const int32_t s = S[n * k + j];
          if (s < 0) continue;
          const T* g = G + int64_t(s) * C;
          for (int64_t c = 0; c < C; ++c) acc[size_t(c)] += load(g[c]);
        }
        for (int64_t c = 0; c < C; ++c) D[n * C + c] = store<T>(acc[size_t(c)]);
      }
    });
  });
}

}  // namespace nk::ops::NK_CPU_NS
