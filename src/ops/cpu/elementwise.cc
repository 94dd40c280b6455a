// Copies, conversions and elementwise arithmetic over whole contiguous tensors
// (CPU kernels; arguments checked by ops/elementwise.cc).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"
#include "ops/dropout_mask.h"

namespace nk::ops::NK_CPU_NS {
namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per task: amortises the fork

template <typename Fn>
void for_range(int64_t n, Fn&& fn) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) { fn(b, e); });
}

template <typename D, typename S>
void convert_kernel(D* dst, const S* src, int64_t n) {
  for_range(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = store<D>(load(src[i]));
  });
}

}  // namespace

void convert(Tensor dst, const Tensor& src) {
  if (dst.dtype() == src.dtype()) {
    if (dst.raw() != src.raw()) std::memmove(dst.raw(), src.raw(), dst.nbytes());
    return;
  }
  dispatch_float(dst.dtype(), "convert", [&](auto dt) {
    using D = decltype(dt);
    dispatch_float(src.dtype(), "convert", [&](auto st) {
      using S = decltype(st);
      convert_kernel(dst.data<D>(), src.data<S>(), dst.numel());
    });
  });
}

void fill(Tensor dst, float value) {
  dispatch_float(dst.dtype(), "fill", [&](auto tag) {
    using T = decltype(tag);
    T* d = dst.data<T>();
    T v = store<T>(value);
    for_range(dst.numel(), [&](int64_t b, int64_t e) { std::fill(d + b, d + e, v); });
  });
}

void copy_to_host(const Tensor& src, float* dst) {
  dispatch_float(src.dtype(), "copy_to_host",
                 [&](auto tag) { convert_kernel(dst, src.data<decltype(tag)>(), src.numel()); });
}

void copy_from_host(Tensor dst, const float* src) {
  dispatch_float(dst.dtype(), "copy_from_host",
                 [&](auto tag) { convert_kernel(dst.data<decltype(tag)>(), src, dst.numel()); });
}

// dst and src may differ in dtype (e.g. bf16 grads into an f32 arena).
void accumulate(Tensor dst, const Tensor& src) {
  dispatch_float(dst.dtype(), "accumulate", [&](auto dt) {
    using D = decltype(dt);
    dispatch_float(src.dtype(), "accumulate", [&](auto st) {
      using S = decltype(st);
      D* d = dst.data<D>();
      const S* s = src.data<S>();
      for_range(dst.numel(), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) d[i] = store<D>(load(d[i]) + load(s[i]));
      });
    });
  });
}

void add(Tensor y, const Tensor& a, const Tensor& b) {
  dispatch_float(y.dtype(), "add", [&](auto tag) {
    using T = decltype(tag);
    T* py = y.data<T>();  // may alias pa or pb: elementwise, so safe
    const T *pa = a.data<T>(), *pb = b.data<T>();
    for_range(y.numel(), [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) py[i] = store<T>(load(pa[i]) + load(pb[i]));
    });
  });
}

int64_t count_nonfinite(const Tensor& x) {
  std::atomic<int64_t> total{0};
  dispatch_float(x.dtype(), "count_nonfinite", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    for_range(x.numel(), [&](int64_t b, int64_t e) {
      int64_t c = 0;
      for (int64_t i = b; i < e; ++i) c += !std::isfinite(load(p[i]));
      total += c;
    });
  });
  return total;
}

namespace {

// sum of p[i]^2 in double: element i into accumulator i % 32, the 32 then
// added pairwise. 32 doubles are whole vectors at every kernel level (8 ymm,
// 4 zmm), so the bits are the same at each, and the independent lanes keep
// the adds from waiting on each other (one scalar chain of dependent adds
// ran at about 4 cycles an element: 75 ms for GPT-2's 124M gradients).
template <typename T>
double chunk_sum_squares(const T* p, int64_t n) {
  constexpr int kLanes = 32;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) {
      const double v = load(p[i + j]);
      acc[j] += v * v;
    }
  }
  for (int j = 0; i + j < n; ++j) {
    const double v = load(p[i + j]);
    acc[j] += v * v;
  }
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
}

}  // namespace

// Fixed chunks (their size depends only on n), each summed by
// chunk_sum_squares, then the partials summed in chunk order: bit-identical
// for any thread count.
double sum_squares(const Tensor& x) {
  constexpr int64_t kMaxChunks = 256;
  const int64_t n = x.numel();
  const int64_t chunk = std::max<int64_t>(1 << 14, (n + kMaxChunks - 1) / kMaxChunks);
  const int64_t nchunks = (n + chunk - 1) / chunk;
  double partial[kMaxChunks] = {};
  dispatch_float(x.dtype(), "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    parallel_for(nchunks, 1, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        const int64_t b = c * chunk;
        partial[c] = chunk_sum_squares(p + b, std::min(n, b + chunk) - b);
      }
    });
  });
  double total = 0;
  for (int64_t c = 0; c < nchunks; ++c) total += partial[c];
  return total;
}

void scale(Tensor x, float s) {
  dispatch_float(x.dtype(), "scale", [&](auto tag) {
    using T = decltype(tag);
    T* p = x.data<T>();
    for_range(x.numel(), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = store<T>(load(p[i]) * s);
    });
  });
}

namespace {

// fn(n, j) for every row n of y [N, M] and column j < m of its block at col0;
// rows split over the threads.
template <typename Fn>
void for_column_block(int64_t N, int64_t m, Fn&& fn) {
  parallel_for(N, std::max<int64_t>(1, kGrain / std::max<int64_t>(m, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t n = b; n < e; ++n)
                   for (int64_t j = 0; j < m; ++j) fn(n, j);
               });
}

}  // namespace

void add_columns(Tensor y, const Tensor& z, int64_t col0, float s) {
  dispatch_float(y.dtype(), "add_columns", [&](auto tag) {
    using T = decltype(tag);
    const int64_t M = y.dim(1), m = z.dim(1);
    T* py = y.data<T>();
    const T* pz = z.data<T>();
    for_column_block(y.dim(0), m, [&](int64_t n, int64_t j) {
      T& d = py[n * M + col0 + j];
      d = store<T>(load(d) + s * load(pz[n * m + j]));
    });
  });
}

void copy_columns(Tensor z, const Tensor& y, int64_t col0, float s) {
  dispatch_float(y.dtype(), "copy_columns", [&](auto tag) {
    using T = decltype(tag);
    const int64_t M = y.dim(1), m = z.dim(1);
    const T* py = y.data<T>();
    T* pz = z.data<T>();
    for_column_block(y.dim(0), m, [&](int64_t n, int64_t j) {
      pz[n * m + j] = store<T>(s * load(py[n * M + col0 + j]));
    });
  });
}

void dropout(Tensor y, const Tensor& x, float p, uint64_t seed) {
  const float keep_scale = 1.f / (1.f - p);
  dispatch_float(y.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    for_range(y.numel(), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        py[i] = dropout_keeps(seed, i, p) ? store<T>(load(px[i]) * keep_scale) : store<T>(0.f);
    });
  });
}

void scale_columns(Tensor y, const Tensor& l, int64_t col0) {
  dispatch_float(y.dtype(), "scale_columns", [&](auto tag) {
    using T = decltype(tag);
    const int64_t M = y.dim(1);
    T* py = y.data<T>();
    const T* pl = l.data<T>();
    for_column_block(y.dim(0), l.dim(0), [&](int64_t n, int64_t j) {
      T& d = py[n * M + col0 + j];
      d = store<T>(load(d) * load(pl[j]));
    });
  });
}

void scale_rows(Tensor y, const Tensor& s) {
  dispatch_float(y.dtype(), "scale_rows", [&](auto tag) {
    using T = decltype(tag);
    const int64_t M = y.dim(1);
    T* py = y.data<T>();
    const float* ps = s.data<float>();
    for_column_block(y.dim(0), M, [&](int64_t n, int64_t j) {
      T& d = py[n * M + j];
      d = store<T>(load(d) * ps[n]);
    });
  });
}

// Columns in parallel, rows summed in order: the same sums for any thread count.
void column_dot(Tensor dl, const Tensor& a, int64_t col0, const Tensor& b) {
  dispatch_float(a.dtype(), "column_dot", [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = a.dim(0), M = a.dim(1), m = b.dim(1);
    const T *pa = a.data<T>(), *pb = b.data<T>();
    float* pd = dl.data<float>();
    parallel_for(m, std::max<int64_t>(1, kGrain / std::max<int64_t>(N, 1)),
                 [&](int64_t s, int64_t e) {
                   for (int64_t j = s; j < e; ++j) {
                     double sum = 0;
                     for (int64_t n = 0; n < N; ++n)
                       sum += double(load(pa[n * M + col0 + j])) * double(load(pb[n * m + j]));
                     pd[j] += float(sum);
                   }
                 });
  });
}

}  // namespace nk::ops::NK_CPU_NS
