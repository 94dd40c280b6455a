// Linear layer on the CPU: the three products go through oneDNN (cached
// primitives, transposes as memory descs); the bias gradient is our own
// deterministic column sum.
#include <algorithm>
#include <utility>

#include "core/parallel.h"
#include "ops/cpu/dnnl_matmul.h"
#include "ops/ops.h"

namespace nk::ops {
namespace {

bool is_compute_dtype(DType t) {
  return t == DType::F32 || t == DType::BF16;
}

void check_cpu_dense(const Tensor& t, const char* name) {
  NK_CHECK(t.device() == Device::CPU, "linear: {} is on {}", name, device_name(t.device()));
  NK_CHECK(t.is_contiguous(), "linear: {} {} is not contiguous", name, t.desc());
}

// Rows of a [..., C] tensor (leading dims flattened), checking the last dim.
int64_t rows_of(const Tensor& t, int64_t c, const char* name) {
  NK_CHECK(t.ndim() >= 1 && t.dim(-1) == c, "linear: {} is {}, last dim should be {}", name,
           t.desc(), c);
  return t.numel() / c;
}

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
  NK_CHECK(w.ndim() == 2, "linear: w is {}, expected [out, in]", w.desc());
  const int64_t out = w.dim(0), in = w.dim(1);
  const int64_t n = rows_of(x, in, "x");
  NK_CHECK(rows_of(y, out, "y") == n, "linear: y {} does not match x {}", y.desc(), x.desc());
  NK_CHECK(is_compute_dtype(x.dtype()), "linear: x is {}", x.desc());
  check_dtype(w, x.dtype(), "linear w");
  check_dtype(y, x.dtype(), "linear y");
  for (auto [t, name] : {std::pair{&x, "x"}, {&w, "w"}, {&y, "y"}}) check_cpu_dense(*t, name);
  cpu::MatmulSpec s{.m = n, .n = out, .k = in, .a = x.dtype(), .b = w.dtype(), .c = y.dtype()};
  s.trans_b = true;  // w^T as a [in,out] view of w's [out,in] rows
  if (b.defined()) {
    check_shape(b, {out}, "linear b");
    check_cpu_dense(b, "b");
    NK_CHECK(b.dtype() == x.dtype() || b.dtype() == DType::F32, "linear: b is {}", b.desc());
    s.has_bias = true;
    s.bias = b.dtype();
  }
  NK_CHECK(in > 0 && out > 0, "linear: empty weight {}", w.desc());
  if (n == 0) return;
  cpu::dnnl_matmul(s, x.raw(), w.raw(), y.raw(), b.defined() ? b.raw() : nullptr);
}

void linear_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                     const Tensor& w) {
  NK_CHECK(w.ndim() == 2, "linear: w is {}, expected [out, in]", w.desc());
  const int64_t out = w.dim(0), in = w.dim(1);
  const int64_t n = rows_of(x, in, "x");
  NK_CHECK(rows_of(dy, out, "dy") == n, "linear: dy {} does not match x {}", dy.desc(), x.desc());
  NK_CHECK(is_compute_dtype(x.dtype()), "linear: x is {}", x.desc());
  check_dtype(w, x.dtype(), "linear w");
  check_dtype(dy, x.dtype(), "linear dy");
  for (auto [t, name] : {std::pair{&x, "x"}, {&w, "w"}, {&dy, "dy"}}) check_cpu_dense(*t, name);
  if (dw.defined()) {
    check_shape(dw, {out, in}, "linear dw");
    check_dtype(dw, DType::F32, "linear dw");
    check_cpu_dense(dw, "dw");
  }
  if (dx.defined()) {
    check_shape(dx, x.shape(), "linear dx");
    check_dtype(dx, x.dtype(), "linear dx");
    check_cpu_dense(dx, "dx");
  }
  if (db.defined()) {
    check_shape(db, {out}, "linear db");
    check_dtype(db, DType::F32, "linear db");
    check_cpu_dense(db, "db");
  }
  NK_CHECK(in > 0 && out > 0, "linear: empty weight {}", w.desc());
  if (n == 0) return;
  const DType t = x.dtype();
  if (dx.defined()) {  // dx[N,in] = dy[N,out] @ w[out,in]
    cpu::MatmulSpec s{.m = n, .n = in, .k = out, .a = t, .b = t, .c = t};
    cpu::dnnl_matmul(s, dy.raw(), w.raw(), dx.raw());
  }
  if (dw.defined()) {  // dw[out,in] += dy^T[out,N] @ x[N,in]; dy^T is a `ba` view of dy's rows
    cpu::MatmulSpec s{.m = out, .n = in, .k = n, .a = t, .b = t, .c = DType::F32};
    s.trans_a = true;
    s.accumulate = true;
    cpu::dnnl_matmul(s, dy.raw(), x.raw(), dw.raw());
  }
  if (db.defined()) {
    if (t == DType::F32)
      column_sum_accumulate(db.data<float>(), dy.data<float>(), n, out);
    else
      column_sum_accumulate(db.data<float>(), dy.data<bf16>(), n, out);
  }
}

}  // namespace nk::ops
