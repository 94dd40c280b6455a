// Rotary position embedding kernels (arguments checked by ops/rope.cc),
// Hugging Face rotate-half convention: within each head of width D, element i
// of its first R (the table's width; R = D unless partial rotary) pairs with
// i + R/2, and elements R..D-1 pass through.
#include <cmath>

#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"

namespace nk::ops::NK_CPU_NS {
namespace {

// x T[rows, W]; row r sits at position pos ? pos[r] : pos0 + r % T; cs f32[maxT, R] = [cos | sin],
// R <= D the rotated values of each head of D.
template <typename T>
void rope_rows(T* x, int64_t rows, int64_t T_, int64_t W, int64_t H, int64_t D, int64_t R,
               const float* cs, int64_t pos0, const int32_t* pos, bool inverse) {
  const int64_t half = R / 2;
  const float sign = inverse ? -1.f : 1.f;
  parallel_for(rows, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *cos = cs + (pos ? int64_t(pos[r]) : pos0 + r % T_) * R, *sin = cos + half;
      for (int64_t h = 0; h < H; ++h) {
        T *a = x + r * W + h * D, *b = a + half;
        for (int64_t i = 0; i < half; ++i) {
          float x1 = load(a[i]), x2 = load(b[i]), s = sign * sin[i];
          a[i] = store<T>(x1 * cos[i] - x2 * s);
          b[i] = store<T>(x2 * cos[i] + x1 * s);
        }
      }
    }
  });
}

}  // namespace

void rope_table(Tensor table, double theta) {
  const int64_t max_t = table.dim(0), head_dim = table.dim(1);
  float* p = table.data<float>();
  const int64_t half = head_dim / 2;
  parallel_for(max_t, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t pos = t0; pos < t1; ++pos) {
      for (int64_t i = 0; i < half; ++i) {
        // Angles in double: positions reach 1e5+, where fp32 angles lose digits.
        double a = double(pos) * std::pow(theta, -2.0 * double(i) / double(head_dim));
        p[pos * head_dim + i] = float(std::cos(a));
        p[pos * head_dim + half + i] = float(std::sin(a));
      }
    }
  });
}

void rope_inplace(Tensor x, int64_t n_heads, int64_t head_dim, const Tensor& table, int64_t pos0,
                  const Tensor& positions, bool inverse) {
  const int64_t T_ = x.dim(1), W = x.dim(2);
  const int32_t* pos = positions.defined() ? positions.data<int32_t>() : nullptr;
  for (int64_t n = 0; pos && n < positions.numel(); ++n)
    if (pos[n] < 0 || pos[n] >= table.dim(0))
      fail("rope_inplace: position id {} at (batch {}, t {}) is outside the table's [0, {})",
           pos[n], n / T_, n % T_, table.dim(0));
  dispatch_float(x.dtype(), "rope_inplace", [&](auto tag) {
    using T = decltype(tag);
    rope_rows(x.data<T>(), x.dim(0) * T_, T_, W, n_heads, head_dim, table.dim(1),
              table.data<float>(), pos0, pos, inverse);
  });
}

}  // namespace nk::ops::NK_CPU_NS
