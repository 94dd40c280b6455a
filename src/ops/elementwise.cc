// Copies, conversions and elementwise arithmetic over whole tensors: checks,
// then the device's kernel.
#include "ops/dispatch.h"
#include "ops/ops.h"

namespace nk::ops {
namespace {

void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  NK_CHECK(a.shape() == b.shape(), "{}: shapes differ: {} vs {}", op, a.desc(), b.desc());
}

}  // namespace

void convert(Tensor dst, const Tensor& src) {
  const Device dev = device_of("convert", {{&dst, "dst"}, {&src, "src"}});
  check_same_shape(dst, src, "convert");
  NK_KERNEL(convert, dev)(dst, src);
}

void fill(Tensor dst, float value) {
  NK_KERNEL(fill, device_of("fill", {{&dst, "dst"}}))(dst, value);
}

void copy_to_host(const Tensor& src, float* dst) {
  NK_KERNEL(copy_to_host, device_of("copy_to_host", {{&src, "src"}}))(src, dst);
}

void copy_from_host(Tensor dst, const float* src) {
  NK_KERNEL(copy_from_host, device_of("copy_from_host", {{&dst, "dst"}}))(dst, src);
}

void accumulate(Tensor dst, const Tensor& src) {
  const Device dev = device_of("accumulate", {{&dst, "dst"}, {&src, "src"}});
  check_same_shape(dst, src, "accumulate");
  NK_KERNEL(accumulate, dev)(dst, src);
}

void add(Tensor y, const Tensor& a, const Tensor& b) {
  const Device dev = device_of("add", {{&y, "y"}, {&a, "a"}, {&b, "b"}});
  check_same_shape(y, a, "add");
  check_same_shape(y, b, "add");
  NK_CHECK(a.dtype() == y.dtype() && b.dtype() == y.dtype(), "add: dtypes {} {} {}", y.desc(),
           a.desc(), b.desc());
  NK_KERNEL(add, dev)(y, a, b);
}

double sum_squares(const Tensor& x) {
  return NK_KERNEL(sum_squares, device_of("sum_squares", {{&x, "x"}}))(x);
}

int64_t count_nonfinite(const Tensor& x) {
  return NK_KERNEL(count_nonfinite, device_of("count_nonfinite", {{&x, "x"}}))(x);
}

void scale(Tensor x, float s) {
  NK_KERNEL(scale, device_of("scale", {{&x, "x"}}))(x, s);
}

namespace {

// y [N, M] and z [N, m] in one float dtype, with the block inside y.
void check_columns(const char* op, const Tensor& y, const Tensor& z, int64_t col0) {
  NK_CHECK(y.ndim() == 2 && z.ndim() == 2 && y.dim(0) == z.dim(0), "{}: y {} and z {}", op,
           y.desc(), z.desc());
  NK_CHECK(col0 >= 0 && col0 + z.dim(1) <= y.dim(1), "{}: columns [{}, {}) outside y {}", op, col0,
           col0 + z.dim(1), y.desc());
  NK_CHECK(y.dtype() == z.dtype(), "{}: dtypes {} and {}", op, y.desc(), z.desc());
}

}  // namespace

void add_columns(Tensor y, const Tensor& z, int64_t col0, float s) {
  const Device dev = device_of("add_columns", {{&y, "y"}, {&z, "z"}});
  check_columns("add_columns", y, z, col0);
  NK_KERNEL(add_columns, dev)(y, z, col0, s);
}

void copy_columns(Tensor z, const Tensor& y, int64_t col0, float s) {
  const Device dev = device_of("copy_columns", {{&z, "z"}, {&y, "y"}});
  check_columns("copy_columns", y, z, col0);
  NK_KERNEL(copy_columns, dev)(z, y, col0, s);
}

void dropout(Tensor y, const Tensor& x, float p, uint64_t seed) {
  const Device dev = device_of("dropout", {{&y, "y"}, {&x, "x"}});
  check_same_shape(y, x, "dropout");
  NK_CHECK(y.dtype() == x.dtype(), "dropout: dtypes {} and {}", y.desc(), x.desc());
  NK_CHECK(p >= 0.f && p < 1.f, "dropout: probability {} outside [0, 1)", p);
  NK_KERNEL(dropout, dev)(y, x, p, seed);
}

void scale_rows(Tensor y, const Tensor& s) {
  const Device dev = device_of("scale_rows", {{&y, "y"}, {&s, "s"}});
  NK_CHECK(y.ndim() == 2 && s.ndim() == 1 && s.dim(0) == y.dim(0), "scale_rows: y {}, s {}",
           y.desc(), s.desc());
  NK_CHECK(s.dtype() == DType::F32, "scale_rows: s {} is not f32", s.desc());
  NK_KERNEL(scale_rows, dev)(y, s);
}

void scale_columns(Tensor y, const Tensor& l, int64_t col0) {
  const Device dev = device_of("scale_columns", {{&y, "y"}, {&l, "l"}});
  NK_CHECK(y.ndim() == 2 && l.ndim() == 1 && col0 >= 0 && col0 + l.dim(0) <= y.dim(1),
           "scale_columns: columns [{}, {}) of y {}", col0, col0 + l.dim(0), y.desc());
  NK_CHECK(y.dtype() == l.dtype(), "scale_columns: dtypes {} and {}", y.desc(), l.desc());
  NK_KERNEL(scale_columns, dev)(y, l, col0);
}

void column_dot(Tensor dl, const Tensor& a, int64_t col0, const Tensor& b) {
  const Device dev = device_of("column_dot", {{&dl, "dl"}, {&a, "a"}, {&b, "b"}});
  check_columns("column_dot", a, b, col0);
  check_shape(dl, {b.dim(1)}, "column_dot dl");
  check_dtype(dl, DType::F32, "column_dot dl");
  NK_KERNEL(column_dot, dev)(dl, a, col0, b);
}

void copy_bytes_from_host(Tensor dst, const void* src) {
  NK_KERNEL(copy_bytes_from_host, device_of("copy_bytes_from_host", {{&dst, "dst"}}))(dst, src);
}

void copy_bytes_to_host(const Tensor& src, void* dst) {
  NK_KERNEL(copy_bytes_to_host, device_of("copy_bytes_to_host", {{&src, "src"}}))(src, dst);
}

void synchronize(Device device) {
  NK_KERNEL(synchronize, device)();
}

Tensor to_device(const Tensor& host, Device device) {
  NK_CHECK(host.on_host() && host.is_contiguous(), "to_device: {} is not dense host memory",
           host.desc());
  if (device == host.device()) return host;
  Tensor t = Tensor::empty(host.shape(), host.dtype(), device);
  copy_bytes_from_host(t, host.raw());
  return t;
}

void upload(Tensor dst, const Tensor& src) {
  NK_CHECK(src.on_host() && src.is_contiguous(), "upload: {} is not dense host memory", src.desc());
  NK_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), "upload: {} into {}",
           src.desc(), dst.desc());
  if (dst.raw() != src.raw()) copy_bytes_from_host(dst, src.raw());
}

int64_t count_not_equal(const Tensor& x, int64_t value) {
  const Device dev = device_of("count_not_equal", {{&x, "x"}});
  check_dtype(x, DType::I32, "count_not_equal x");
  return NK_KERNEL(count_not_equal, dev)(x, value);
}

}  // namespace nk::ops
