// LayerNorm and RMSNorm over the last dimension: x, y T[N,C]; w, b T[C];
// mean, rstd f32[N]. Checks, then the device's kernel.
#include "ops/dispatch.h"
#include "ops/ops.h"

namespace nk::ops {
namespace {

// Shapes and dtypes shared by both norms and both directions.
void check_norm_args(const char* op, const Tensor& x, const Tensor& w, const Tensor& y,
                     const Tensor& rstd) {
  NK_CHECK(x.ndim() >= 1, "{}: x is a scalar", op);
  check_shape(y, x.shape(), "y/dy");
  check_shape(w, {x.dim(-1)}, "w");
  check_shape(rstd, {rows_of(x)}, "rstd");
  check_dtype(rstd, DType::F32, "rstd");
  NK_CHECK(y.dtype() == x.dtype() && w.dtype() == x.dtype(), "{}: dtypes differ: x {}, y {}, w {}",
           op, x.desc(), y.desc(), w.desc());
}

void check_mean(const Tensor& mean, const Tensor& x) {
  check_shape(mean, {rows_of(x)}, "mean");
  check_dtype(mean, DType::F32, "mean");
}

void check_dx(const Tensor& dx, const Tensor& x) {
  check_shape(dx, x.shape(), "dx");
  check_dtype(dx, x.dtype(), "dx");
}

// A parameter gradient f32[C], or undefined: not computed.
void check_param_grad(const Tensor& g, const Tensor& x, const char* name) {
  if (!g.defined()) return;
  check_shape(g, {x.dim(-1)}, name);
  check_dtype(g, DType::F32, name);
}

}  // namespace

void layernorm_forward(Tensor y, Tensor mean, Tensor rstd, const Tensor& x, const Tensor& w,
                       const Tensor& b, float eps) {
  const char* op = "layernorm_forward";
  const Device dev = device_of(
      op,
      {{&y, "y"}, {&mean, "mean"}, {&rstd, "rstd"}, {&x, "x"}, {&w, "w"}, {&b, "b", kOptional}});
  check_norm_args(op, x, w, y, rstd);
  check_mean(mean, x);
  if (b.defined()) {
    check_shape(b, {x.dim(-1)}, "b");
    check_dtype(b, x.dtype(), "b");
  }
  NK_KERNEL(layernorm_forward, dev)(y, mean, rstd, x, w, b, eps);
}

void layernorm_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd) {
  const char* op = "layernorm_backward";
  const Device dev = device_of(op, {{&dx, "dx"},
                                    {&dw, "dw", kOptional},
                                    {&db, "db", kOptional},
                                    {&dy, "dy"},
                                    {&x, "x"},
                                    {&w, "w"},
                                    {&mean, "mean"},
                                    {&rstd, "rstd"}});
  check_norm_args(op, x, w, dy, rstd);
  check_dx(dx, x);
  check_mean(mean, x);
  check_param_grad(dw, x, "dw");
  check_param_grad(db, x, "db");
  NK_KERNEL(layernorm_backward, dev)(dx, dw, db, dy, x, w, mean, rstd);
}

void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps,
                     float w_offset) {
  const char* op = "rmsnorm_forward";
  const Device dev = device_of(op, {{&y, "y"}, {&rstd, "rstd"}, {&x, "x"}, {&w, "w"}});
  check_norm_args(op, x, w, y, rstd);
  NK_KERNEL(rmsnorm_forward, dev)(y, rstd, x, w, eps, w_offset);
}

void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, float w_offset) {
  const char* op = "rmsnorm_backward";
  const Device dev = device_of(
      op,
      {{&dx, "dx"}, {&dw, "dw", kOptional}, {&dy, "dy"}, {&x, "x"}, {&w, "w"}, {&rstd, "rstd"}});
  check_norm_args(op, x, w, dy, rstd);
  check_dx(dx, x);
  check_param_grad(dw, x, "dw");
  NK_KERNEL(rmsnorm_backward, dev)(dx, dw, dy, x, w, rstd, w_offset);
}

}  // namespace nk::ops
