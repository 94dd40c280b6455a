// GELU, SiLU, ReLU, SwiGLU, GeGLU and soft-capping: checks, then the device's kernel.
#include <cmath>

#include "ops/dispatch.h"
#include "ops/ops.h"

namespace nk::ops {
namespace {

void check_same(const char* op, const Tensor& a, const char* an, const Tensor& b, const char* bn) {
  NK_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype(), "{}: {} {} vs {} {}", op, an, a.desc(),
           bn, b.desc());
}

// y T[..., F] against gu T[..., 2F].
void check_swiglu(const char* op, const Tensor& y, const Tensor& gu) {
  NK_CHECK(gu.ndim() >= 1 && gu.dim(-1) % 2 == 0, "{}: gu {} has an odd last dim", op, gu.desc());
  Shape ys = gu.shape();
  ys.back() /= 2;
  check_shape(y, ys, "y/dy");
  check_dtype(y, gu.dtype(), "y/dy");
}

}  // namespace

// The elementwise ones: y (dx) against x (and dy), one dtype and shape.
#define NK_UNARY_ACTIVATION(name)                                                           \
  void name##_forward(Tensor y, const Tensor& x) {                                          \
    const Device dev = device_of(#name "_forward", {{&y, "y"}, {&x, "x"}});                 \
    check_same(#name "_forward", y, "y", x, "x");                                           \
    NK_KERNEL(name##_forward, dev)(y, x);                                                   \
  }                                                                                         \
  void name##_backward(Tensor dx, const Tensor& dy, const Tensor& x) {                      \
    const Device dev = device_of(#name "_backward", {{&dx, "dx"}, {&dy, "dy"}, {&x, "x"}}); \
    check_same(#name "_backward", dx, "dx", x, "x");                                        \
    check_same(#name "_backward", dy, "dy", x, "x");                                        \
    NK_KERNEL(name##_backward, dev)(dx, dy, x);                                             \
  }
NK_UNARY_ACTIVATION(gelu)
NK_UNARY_ACTIVATION(silu)
NK_UNARY_ACTIVATION(relu)
#undef NK_UNARY_ACTIVATION

void swiglu_forward(Tensor y, const Tensor& gu) {
  const Device dev = device_of("swiglu_forward", {{&y, "y"}, {&gu, "gu"}});
  check_swiglu("swiglu_forward", y, gu);
  NK_KERNEL(swiglu_forward, dev)(y, gu);
}

void swiglu_backward(Tensor dgu, const Tensor& dy, const Tensor& gu) {
  const Device dev = device_of("swiglu_backward", {{&dgu, "dgu"}, {&dy, "dy"}, {&gu, "gu"}});
  check_swiglu("swiglu_backward", dy, gu);
  check_same("swiglu_backward", dgu, "dgu", gu, "gu");
  NK_KERNEL(swiglu_backward, dev)(dgu, dy, gu);
}

void geglu_forward(Tensor y, const Tensor& gu) {
  const Device dev = device_of("geglu_forward", {{&y, "y"}, {&gu, "gu"}});
  check_swiglu("geglu_forward", y, gu);
  pick_kernel("geglu_forward", dev, cpu_kernels().geglu_forward)(y, gu);
}

void geglu_backward(Tensor dgu, const Tensor& dy, const Tensor& gu) {
  const Device dev = device_of("geglu_backward", {{&dgu, "dgu"}, {&dy, "dy"}, {&gu, "gu"}});
  check_swiglu("geglu_backward", dy, gu);
  check_same("geglu_backward", dgu, "dgu", gu, "gu");
  pick_kernel("geglu_backward", dev, cpu_kernels().geglu_backward)(dgu, dy, gu);
}

void softcap_forward(Tensor y, const Tensor& x, float cap) {
  const Device dev = device_of("softcap_forward", {{&y, "y"}, {&x, "x"}});
  check_same("softcap_forward", y, "y", x, "x");
  NK_CHECK(cap > 0 && std::isfinite(cap), "softcap_forward: cap {} must be positive", cap);
  pick_kernel("softcap_forward", dev, cpu_kernels().softcap_forward)(y, x, cap);
}

void softcap_backward(Tensor dx, const Tensor& dy, const Tensor& y, float cap) {
  const Device dev = device_of("softcap_backward", {{&dx, "dx"}, {&dy, "dy"}, {&y, "y"}});
  check_same("softcap_backward", dx, "dx", y, "y");
  check_same("softcap_backward", dy, "dy", y, "y");
  NK_CHECK(cap > 0 && std::isfinite(cap), "softcap_backward: cap {} must be positive", cap);
  pick_kernel("softcap_backward", dev, cpu_kernels().softcap_backward)(dx, dy, y, cap);
}

}  // namespace nk::ops
