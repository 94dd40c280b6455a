// Linear layer kernels on the CPU (arguments checked by ops/linear.cc): the
// three products go through oneDNN (cached primitives, transposes as memory
// descs); the bias gradient is our own deterministic column sum.
#include <algorithm>

#include "core/parallel.h"
#include "ops/cpu/dnnl_matmul.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"
#include "ops/shapes.h"

namespace nk::ops::NK_CPU_NS {
namespace {

// db[o] += sum_n dy[n,o] in fp32. Columns are split into fixed tiles; each
// column's sum runs over rows in the same order (blocks of kRowBlock rows, block
// sums added in order) whatever the thread count, so the result is
// deterministic, and blocking keeps the fp32 error growth small. Stack buffers:
// no allocation in the step.
template <typename T>
void column_sum_accumulate(float* db, const T* dy, int64_t n, int64_t out) {
  constexpr int64_t kCols = 256, kRowBlock = 64;
  const int64_t tiles = (out + kCols - 1) / kCols;
  parallel_for(tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t tile = t0; tile < t1; ++tile) {
      const int64_t c0 = tile * kCols, w = std::min(kCols, out - c0);
      float total[kCols] = {}, part[kCols];
      for (int64_t r0 = 0; r0 < n; r0 += kRowBlock) {
        std::fill(part, part + w, 0.f);
        for (int64_t r = r0; r < std::min(n, r0 + kRowBlock); ++r) {
          const T* row = dy + r * out + c0;
          for (int64_t j = 0; j < w; ++j) part[j] += to_f32(row[j]);
        }
        for (int64_t j = 0; j < w; ++j) total[j] += part[j];
      }
      for (int64_t j = 0; j < w; ++j) db[c0 + j] += total[j];
    }
  });
}

}  // namespace

// y[N,out] = x[N,in] @ w[out,in]^T + b[out]
void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t out = w.dim(0), in = w.dim(1), n = rows_of(x);
  MatmulSpec s{.m = n, .n = out, .k = in, .a = x.dtype(), .b = w.dtype(), .c = y.dtype()};
  s.trans_b = true;  // w^T as a [in,out] view of w's [out,in] rows
  if (b.defined()) {
    s.has_bias = true;
    s.bias = b.dtype();
  }
  dnnl_matmul(s, x.raw(), w.raw(), y.raw(), b.defined() ? b.raw() : nullptr);
}

void linear_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                     const Tensor& w) {
  const int64_t out = w.dim(0), in = w.dim(1), n = rows_of(x);
  const DType t = x.dtype();
  if (dx.defined()) {  // dx[N,in] = dy[N,out] @ w[out,in]
    MatmulSpec s{.m = n, .n = in, .k = out, .a = t, .b = t, .c = t};
    dnnl_matmul(s, dy.raw(), w.raw(), dx.raw());
  }
  if (dw.defined()) {  // dw[out,in] += dy^T[out,N] @ x[N,in]; dy^T is a `ba` view of dy's rows
    MatmulSpec s{.m = out, .n = in, .k = n, .a = t, .b = t, .c = DType::F32};
    s.trans_a = true;
    s.accumulate = true;
    dnnl_matmul(s, dy.raw(), x.raw(), dw.raw());
  }
  if (db.defined()) {
    if (t == DType::F32)
      column_sum_accumulate(db.data<float>(), dy.data<float>(), n, out);
    else
      column_sum_accumulate(db.data<float>(), dy.data<bf16>(), n, out);
  }
}

}  // namespace nk::ops::NK_CPU_NS
