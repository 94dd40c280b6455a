// Linear layer y[N,out] = x[N,in] @ w[out,in]^T + b[out]: checks, then the
// device's kernel.
#include "ops/dispatch.h"
#include "ops/ops.h"
#include "ops/shapes.h"

namespace nk::ops {
namespace {

// w [out, in] in x's compute dtype; returns N.
int64_t check_x_w(const Tensor& x, const Tensor& w) {
  NK_CHECK(w.ndim() == 2, "linear: w is {}, expected [out, in]", w.desc());
  NK_CHECK(w.dim(0) > 0 && w.dim(1) > 0, "linear: empty weight {}", w.desc());
  NK_CHECK(is_compute_dtype(x.dtype()), "linear: x is {}", x.desc());
  check_dtype(w, x.dtype(), "linear w");
  return rows_checked("linear", x, w.dim(1), "x");
}

// A parameter gradient f32 of `shape`, or undefined: not computed.
void check_param_grad(const Tensor& g, const Shape& shape, const char* name) {
  if (!g.defined()) return;
  check_shape(g, shape, name);
  check_dtype(g, DType::F32, name);
}

}  // namespace

void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& b) {
  const Device dev =
      device_of("linear_forward", {{&y, "y"}, {&x, "x"}, {&w, "w"}, {&b, "b", kOptional}});
  const int64_t n = check_x_w(x, w), out = w.dim(0);
  NK_CHECK(rows_checked("linear", y, out, "y") == n, "linear: y {} does not match x {}", y.desc(),
           x.desc());
  check_dtype(y, x.dtype(), "linear y");
  if (b.defined()) {
    check_shape(b, {out}, "linear b");
    NK_CHECK(b.dtype() == x.dtype() || b.dtype() == DType::F32, "linear: b is {}", b.desc());
  }
  if (n == 0) return;
  NK_KERNEL(linear_forward, dev)(y, x, w, b);
}

void linear_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                     const Tensor& w) {
  const Device dev = device_of("linear_backward", {{&dx, "dx", kOptional},
                                                   {&dw, "dw", kOptional},
                                                   {&db, "db", kOptional},
                                                   {&dy, "dy"},
                                                   {&x, "x"},
                                                   {&w, "w"}});
  const int64_t n = check_x_w(x, w), out = w.dim(0), in = w.dim(1);
  NK_CHECK(rows_checked("linear", dy, out, "dy") == n, "linear: dy {} does not match x {}",
           dy.desc(), x.desc());
  check_dtype(dy, x.dtype(), "linear dy");
  if (dx.defined()) {
    check_shape(dx, x.shape(), "linear dx");
    check_dtype(dx, x.dtype(), "linear dx");
  }
  check_param_grad(dw, {out, in}, "linear dw");
  check_param_grad(db, {out}, "linear db");
  if (n == 0) return;
  NK_KERNEL(linear_backward, dev)(dx, dw, db, dy, x, w);
}

}  // namespace nk::ops
