// Mixture-of-Experts routing and token movement on CUDA (arguments checked by
// ops/moe.cc; semantics in ops/moe.h; CPU twin in ops/cpu/moe.cc, whose
// arithmetic these kernels repeat step for step).
//
// The router runs one thread per row, in double like the CPU: E is small and
// the scores decide which experts run. A row's scores are recomputed from its
// logits wherever they are needed (the same expressions, so the same values
// each time) rather than held in E-sized per-thread arrays; the choice (group
// scores, then the k best) scans the row k + topk_group times. The statistics
// (the balancing scores' and the squared log-sum-exps' sums per segment) are
// summed by one thread per (segment, column) over the segment's rows in row
// order, from the per-row sums the routing kernel leaves behind: the CPU's
// order of additions, so the same bits whatever the launch shape.
//
// The token movement kernels check the slots and source rows they read (a bad
// one is the CPU's nk::Error, and nothing is written); gather, combine and
// scatter run one thread per element, each output element summing its row's k
// pairs in j order in fp32 as the CPU does; combine's backward runs one warp
// per (row, pair), the dot product in double.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/moe.h"

namespace nk::ops::cuda {
namespace {

// The group-limited choice keeps its groups in one 64-bit mask.
constexpr int64_t kMaxGroups = 64;

// One row's logits and bias, read as the CPU reads them.
template <typename T>
struct RouterRow {
  const T* l;
  const void* bias;  // f32 or T [E], or null
  bool bias_f32;
  int64_t E;
  bool sigmoid;
  double mx, s;  // the logits' max and sum of e^(l - mx)

  __device__ double logit(int64_t e) const { return double(load(l[e])); }
  __device__ double bias_of(int64_t e) const {
    if (!bias) return 0.0;
    return bias_f32 ? double(static_cast<const float*>(bias)[e])
                    : double(load(static_cast<const T*>(bias)[e]));
  }
  // softmax (mx, s set) or sigmoid score of expert e
  __device__ double score(int64_t e) const {
    return sigmoid ? 1.0 / (1.0 + exp(-logit(e))) : exp(logit(e) - mx) / s;
  }
  // the choice score: the score plus the bias
  __device__ double choice(int64_t e) const { return score(e) + bias_of(e); }
};

// Fills mx and s of row r (the softmax's max and normaliser).
template <typename T>
__device__ void softmax_stats(RouterRow<T>& r) {
  r.mx = -INFINITY;
  for (int64_t e = 0; e < r.E; ++e) r.mx = fmax(r.mx, r.logit(e));
  r.s = 0;
  for (int64_t e = 0; e < r.E; ++e) r.s += exp(r.logit(e) - r.mx);
}

// Per row n of logits T[N, E]: probs, idx, weights (ops/moe.h), and rowinfo
// f64[N, 2] = {sum of the row's f32 probs in order, logsumexp(row)} for the
// statistics kernel.
template <typename T>
__global__ void moe_route_kernel(float* P, int32_t* I, float* W, double* rowinfo, const T* L,
                                 const void* bias, bool bias_f32, int64_t N, int64_t E, int64_t k,
                                 bool sigmoid, bool norm_topk, int64_t G, int64_t topk_group,
                                 double scaling) {
  NK_GRID_STRIDE(n, N) {
    RouterRow<T> r{L + n * E, bias, bias_f32, E, sigmoid, 0.0, 0.0};
    softmax_stats(r);
    double row = 0;
    for (int64_t e = 0; e < E; ++e) {
      const float p = float(r.score(e));
      P[n * E + e] = p;
      row += double(p);
    }
    rowinfo[2 * n] = row;
    rowinfo[2 * n + 1] = r.mx + log(r.s);
    // Group-limited: the topk_group groups of largest score (the sum of their
    // two largest choice scores), ties to the lower group.
    const int64_t per_group = E / G;
    uint64_t kept = ~0ull;
    if (G > 1) {
      kept = 0;
      for (int64_t j = 0; j < topk_group; ++j) {
        int64_t best = -1;
        double best_score = 0;
        for (int64_t g = 0; g < G; ++g) {
          if (kept >> g & 1) continue;
          double m1 = -INFINITY, m2 = -INFINITY;
          for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
            const double v = r.choice(e);
            if (v > m1) {
              m2 = m1;
              m1 = v;
            } else if (v > m2) {
              m2 = v;
            }
          }
          const double gs = per_group > 1 ? m1 + m2 : m1;
          if (best < 0 || gs > best_score) {
            best = g;
            best_score = gs;
          }
        }
        kept |= 1ull << best;
      }
    }
    // The k experts of largest choice score among the kept groups, ties to
    // the lower expert; an expert already chosen is skipped.
    int32_t* sel = I + n * k;
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      double best_c = 0;
      for (int64_t e = 0; e < E; ++e) {
        if (G > 1 && !(kept >> (e / per_group) & 1)) continue;
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken |= sel[i] == e;
        if (taken) continue;
        const double c = r.choice(e);
        if (best < 0 || c > best_c) {
          best = e;
          best_c = c;
        }
      }
      sel[j] = int32_t(best);
      sum += r.score(best);
    }
    for (int64_t j = 0; j < k; ++j) {
      const double w = r.score(sel[j]);
      W[n * k + j] = float((norm_topk ? w / sum : w) * scaling);
    }
  }
}

// stats f32[S, E + 1]: thread (s, e) sums, over segment s's rows in order,
// the balancing score of e (e < E: probs / the row's sum for sigmoid, probs
// for softmax) or the squared logsumexp (e = E).
__global__ void moe_route_stats_kernel(float* St, const float* P, const double* rowinfo, int64_t S,
                                       int64_t rows_per_seg, int64_t E, bool sigmoid) {
  NK_GRID_STRIDE(i, S * (E + 1)) {
    const int64_t s = i / (E + 1), e = i - s * (E + 1);
    double a = 0;
    for (int64_t n = s * rows_per_seg; n < (s + 1) * rows_per_seg; ++n) {
      if (e < E) {
        a += double(P[n * E + e]) / (sigmoid ? rowinfo[2 * n] : 1.0);
      } else {
        const double lse = rowinfo[2 * n + 1];
        a += lse * lse;
      }
    }
    St[i] = float(a);
  }
}

// dlogits T[N, E], one thread per row (ops/cpu/moe.cc's moe_route_backward);
// an expert id of idx outside [0, E) is reported to err and its row skipped.
template <typename T>
__global__ void moe_route_backward_kernel(T* DL, const float* DW, const float* GB, float z_grad,
                                          const T* L, const float* P, const int32_t* I,
                                          DeviceError err, int64_t N, int64_t E, int64_t k,
                                          int64_t rows_per_seg, bool sigmoid, bool norm_topk,
                                          double scaling) {
  NK_GRID_STRIDE(n, N) {
    const float* p = P + n * E;
    const int32_t* sel = I + n * k;
    const float* dw = DW + n * k;
    const float* Gs = GB + (n / rows_per_seg) * E;
    bool bad = false;
    for (int64_t j = 0; j < k; ++j)
      if (sel[j] < 0 || sel[j] >= E) {
        report(err, n * k + j, sel[j]);
        bad = true;
      }
    if (bad) continue;
    // weights w_j = scaling p_sel_j / Z (Z = sum of the selected, or 1).
    double Z = 1, wdw = 0;
    if (norm_topk) {
      Z = 0;
      for (int64_t j = 0; j < k; ++j) Z += p[sel[j]];
      for (int64_t j = 0; j < k; ++j) wdw += scaling * double(dw[j]) * p[sel[j]] / Z;
    }
    // The balancing score: p itself (softmax) or p / sum p (sigmoid).
    double sp = 0, bg = 0;
    if (sigmoid) {
      for (int64_t e = 0; e < E; ++e) sp += p[e];
      for (int64_t e = 0; e < E; ++e) bg += double(p[e]) / sp * Gs[e];
    }
    // d loss / d score of expert e, as the CPU accumulates it.
    auto dp = [&](int64_t e) {
      double d = 0;
      for (int64_t j = 0; j < k; ++j)
        if (sel[j] == e) d += (scaling * double(dw[j]) - wdw) / Z;
      return d + (sigmoid ? (double(Gs[e]) - bg) / sp : double(Gs[e]));
    };
    RouterRow<T> r{L + n * E, nullptr, false, E, false, 0.0, 0.0};
    softmax_stats(r);
    const double lse = r.mx + log(r.s);
    double pdp = 0;
    if (!sigmoid)
      for (int64_t e = 0; e < E; ++e) pdp += double(p[e]) * dp(e);
    for (int64_t e = 0; e < E; ++e) {
      const double pe = p[e];
      double d = sigmoid ? dp(e) * pe * (1 - pe) : pe * (dp(e) - pdp);
      d += double(z_grad) * 2 * lse * r.score(e);
      DL[n * E + e] = store<T>(float(d));
    }
  }
}

// err <- the first of ids i32[n] outside [lo, hi).
__global__ void check_range_kernel(DeviceError err, const int32_t* ids, int64_t n, int64_t lo,
                                   int64_t hi) {
  NK_GRID_STRIDE(i, n) {
    if (ids[i] < lo || ids[i] >= hi) report(err, i, ids[i]);
  }
}

// Reports a bad id of ids i32[n] (outside [lo, hi)) as `what` formats it
// from (id, index); waits for the device.
template <typename Fmt>
void check_range(const int32_t* ids, int64_t n, int64_t lo, int64_t hi, Fmt&& what) {
  if (n == 0) return;
  ErrorFlag flag;
  check_range_kernel<<<blocks_for(n), kThreads, 0, nk::cuda::stream()>>>(flag.device(), ids, n, lo,
                                                                         hi);
  NK_CUDA_LAUNCHED("check_range_kernel");
  if (const auto [i, id] = flag.read(); i >= 0) what(id, i);
}

template <typename T>
__global__ void moe_gather_kernel(T* xs, const T* x, const int32_t* src, int64_t M, int64_t C) {
  NK_GRID_STRIDE(i, M * C) {
    const int64_t m = i / C, c = i - m * C;
    xs[i] = x[int64_t(src[m]) * C + c];
  }
}

// y[n, c] = sum_j weights[n, j] out[slot[n, j], c] in fp32, j in order
// (moe_combine); W null: the weights are 1 (moe_scatter: 1 x is x exactly).
template <typename T>
__global__ void moe_combine_kernel(T* y, const T* out, const int32_t* slot, const float* W,
                                   int64_t N, int64_t C, int64_t k) {
  NK_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i - n * C;
    float acc = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t s = slot[n * k + j];
      if (s < 0) continue;
      acc += (W ? W[n * k + j] : 1.f) * load(out[int64_t(s) * C + c]);
    }
    y[i] = store<T>(acc);
  }
}

// One warp per pair (n, j): dout[slot] = w dy[n]; dweights = dy[n] . out[slot].
template <typename T>
__global__ void moe_combine_backward_kernel(T* dout, float* DW, const T* dy, const T* out,
                                            const int32_t* slot, const float* W, int64_t N,
                                            int64_t C, int64_t k) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t pair = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; pair < N * k;
       pair += warps) {
    const int64_t n = pair / k;
    const int32_t s = slot[pair];
    if (s < 0) {
      if (lane == 0) DW[pair] = 0.f;
      continue;
    }
    const float w = W[pair];
    const T* d = dy + n * C;
    const T* o = out + int64_t(s) * C;
    T* g = dout + int64_t(s) * C;
    double dot = 0;
    for (int64_t c = lane; c < C; c += 32) {
      const float dv = load(d[c]);
      dot += double(dv) * double(load(o[c]));
      g[c] = store<T>(w * dv);
    }
    for (int o2 = 16; o2 > 0; o2 >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o2);
    if (lane == 0) DW[pair] = float(dot);
  }
}

// The slots i32[N, k] each in [-1, M), as the CPU's check_slot reports them.
void check_slots(const char* op, const Tensor& slot, int64_t M) {
  const int64_t k = slot.dim(1);
  check_range(slot.data<int32_t>(), slot.numel(), -1, M, [&](int64_t s, int64_t i) {
    fail("{}: slot {} of row {} is outside [-1, {})", op, s, i / k, M);
  });
}

// y = the weighted (weights undefined: summed) rows of out its slots name.
void combine_rows(const char* op, Tensor y, const Tensor& out, const Tensor& slot,
                  const Tensor& weights) {
  const int64_t N = y.dim(0), C = y.dim(1), k = slot.dim(1);
  check_slots(op, slot, out.dim(0));
  if (N * C == 0) return;
  dispatch_float(y.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    moe_combine_kernel<T><<<blocks_for(N * C), kThreads, 0, nk::cuda::stream()>>>(
        y.data<T>(), out.data<T>(), slot.data<int32_t>(),
        weights.defined() ? weights.data<float>() : nullptr, N, C, k);
    NK_CUDA_LAUNCHED("moe_combine_kernel");
  });
}

}  // namespace

void moe_route(Tensor probs, Tensor idx, Tensor weights, Tensor stats, const Tensor& logits,
               const Tensor& bias, const MoeRouteSpec& spec) {
  const int64_t N = logits.dim(0), E = logits.dim(1), k = idx.dim(1);
  const int64_t S = stats.ndim() == 2 ? stats.dim(0) : 1;
  NK_CHECK(spec.n_group <= kMaxGroups, "moe_route: {} expert groups on CUDA (at most {})",
           spec.n_group, kMaxGroups);
  const cudaStream_t stream = nk::cuda::stream();
  Tensor rowinfo = Tensor::empty({std::max<int64_t>(N, 1), 2}, DType::F64, Device::CUDA);
  if (N > 0) {
    dispatch_float(logits.dtype(), "moe_route", [&](auto tag) {
      using T = decltype(tag);
      moe_route_kernel<T><<<blocks_for(N, 128), 128, 0, stream>>>(
          probs.data<float>(), idx.data<int32_t>(), weights.data<float>(), rowinfo.data<double>(),
          logits.data<T>(), bias.defined() ? bias.raw() : nullptr,
          bias.defined() && bias.dtype() == DType::F32, N, E, k, spec.sigmoid, spec.norm_topk,
          spec.n_group, spec.topk_group, spec.scaling);
      NK_CUDA_LAUNCHED("moe_route_kernel");
    });
  }
  moe_route_stats_kernel<<<blocks_for(S * (E + 1), 64), 64, 0, stream>>>(
      stats.data<float>(), probs.data<float>(), rowinfo.data<double>(), S, N / S, E, spec.sigmoid);
  NK_CUDA_LAUNCHED("moe_route_stats_kernel");
}

void moe_route_backward(Tensor dlogits, const Tensor& dweights, const Tensor& balance_grad,
                        float z_grad, const Tensor& logits, const Tensor& probs, const Tensor& idx,
                        const MoeRouteSpec& spec) {
  const int64_t N = logits.dim(0), E = logits.dim(1), k = idx.dim(1);
  if (N == 0) return;
  const int64_t S = balance_grad.ndim() == 2 ? balance_grad.dim(0) : 1;
  ErrorFlag err;
  dispatch_float(logits.dtype(), "moe_route_backward", [&](auto tag) {
    using T = decltype(tag);
    moe_route_backward_kernel<T><<<blocks_for(N, 128), 128, 0, nk::cuda::stream()>>>(
        dlogits.data<T>(), dweights.data<float>(), balance_grad.data<float>(), z_grad,
        logits.data<T>(), probs.data<float>(), idx.data<int32_t>(), err.device(), N, E, k, N / S,
        spec.sigmoid, spec.norm_topk, spec.scaling);
    NK_CUDA_LAUNCHED("moe_route_backward_kernel");
  });
  if (const auto [i, id] = err.read(); i >= 0)
    fail("moe_route_backward: expert {} of row {}", id, i / k);
}

void moe_gather(Tensor xs, const Tensor& x, const Tensor& src) {
  const int64_t M = xs.dim(0), C = xs.dim(1), N = x.dim(0);
  check_range(src.data<int32_t>(), M, 0, N, [&](int64_t id, int64_t m) {
    fail("moe_gather: source row {} of slot {} is outside [0, {})", id, m, N);
  });
  if (M * C == 0) return;
  dispatch_float(x.dtype(), "moe_gather", [&](auto tag) {
    using T = decltype(tag);
    moe_gather_kernel<T><<<blocks_for(M * C), kThreads, 0, nk::cuda::stream()>>>(
        xs.data<T>(), x.data<T>(), src.data<int32_t>(), M, C);
    NK_CUDA_LAUNCHED("moe_gather_kernel");
  });
}

void moe_combine(Tensor y, const Tensor& out, const Tensor& slot, const Tensor& weights) {
  combine_rows("moe_combine", y, out, slot, weights);
}

void moe_combine_backward(Tensor dout, Tensor dweights, const Tensor& dy, const Tensor& out,
                          const Tensor& slot, const Tensor& weights) {
  const int64_t N = dy.dim(0), C = dy.dim(1), k = slot.dim(1);
  check_slots("moe_combine_backward", slot, out.dim(0));
  if (N * k == 0) return;
  dispatch_float(dy.dtype(), "moe_combine_backward", [&](auto tag) {
    using T = decltype(tag);
    moe_combine_backward_kernel<T><<<blocks_for(N * k * 32), kThreads, 0, nk::cuda::stream()>>>(
        dout.data<T>(), dweights.data<float>(), dy.data<T>(), out.data<T>(), slot.data<int32_t>(),
        weights.data<float>(), N, C, k);
    NK_CUDA_LAUNCHED("moe_combine_backward_kernel");
  });
}

void moe_scatter(Tensor dx, const Tensor& dxs, const Tensor& slot) {
  combine_rows("moe_scatter", dx, dxs, slot, Tensor());
}

}  // namespace nk::ops::cuda
