// Rotary position embedding (Hugging Face rotate-half): checks, then the
// device's kernel.
#include "ops/dispatch.h"
#include "ops/ops.h"

namespace nk::ops {
namespace {

// Shared checks of both rope_inplace overloads.
Device check_rope(const Tensor& x, int64_t n_heads, int64_t head_dim, const Tensor& table,
                  const Tensor& positions) {
  const Device dev = device_of(
      "rope_inplace", {{&x, "x"}, {&table, "table"}, {&positions, "positions", kOptional}});
  check_dtype(table, DType::F32, "table");
  NK_CHECK(x.ndim() == 3, "rope_inplace: x {} is not [B, T, W]", x.desc());
  // A narrower table rotates only the first table.dim(1) values of each head.
  NK_CHECK(
      table.ndim() == 2 && table.dim(1) > 0 && table.dim(1) % 2 == 0 && table.dim(1) <= head_dim,
      "rope_inplace: table {} does not fit head_dim {} (needs an even width <= head_dim)",
      table.desc(), head_dim);
  NK_CHECK(n_heads >= 0 && n_heads * head_dim <= x.dim(2),
           "rope_inplace: {} heads of {} exceed W={}", n_heads, head_dim, x.dim(2));
  return dev;
}

}  // namespace

Tensor rope_table(int64_t max_t, int64_t head_dim, double theta) {
  NK_CHECK(max_t >= 0 && head_dim > 0 && head_dim % 2 == 0 && theta > 0,
           "rope_table: max_t {}, head_dim {} (must be even), theta {}", max_t, head_dim, theta);
  Tensor t = Tensor::empty({max_t, head_dim}, DType::F32);
  // Built in host memory (ops::to_device moves it): the CPU kernel alone.
  pick_kernel("rope_table", t.device(), cpu_kernels().rope_table)(t, theta);
  return t;
}

void rope_inplace(Tensor x, int64_t n_heads, int64_t head_dim, const Tensor& table, int64_t pos0,
                  bool inverse) {
  const Device dev = check_rope(x, n_heads, head_dim, table, Tensor());
  NK_CHECK(pos0 >= 0 && pos0 + x.dim(1) <= table.dim(0),
           "rope_inplace: positions [{}, {}) exceed table {}", pos0, pos0 + x.dim(1), table.desc());
  NK_KERNEL(rope_inplace, dev)(x, n_heads, head_dim, table, pos0, Tensor(), inverse);
}

void rope_inplace(Tensor x, int64_t n_heads, int64_t head_dim, const Tensor& table,
                  const Tensor& positions, bool inverse) {
  NK_CHECK(positions.defined(), "rope_inplace: positions is undefined");
  const Device dev = check_rope(x, n_heads, head_dim, table, positions);
  check_dtype(positions, DType::I32, "positions");
  check_shape(positions, {x.dim(0), x.dim(1)}, "positions");
  NK_KERNEL(rope_inplace, dev)(x, n_heads, head_dim, table, 0, positions, inverse);
}

}  // namespace nk::ops
