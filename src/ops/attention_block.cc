// Attention of local queries to one block of keys and values (ring
// attention's step, ops.h): checks, then the CPU kernel (the only one).
#include "ops/dispatch.h"
#include "ops/ops.h"

namespace nk::ops {
namespace {

struct BlockDims {
  int64_t B, Tq, Tk, Hq, Hkv, D;
};

BlockDims check_block(const Tensor& qkv, const Tensor& kv, const Tensor& qpos, const Tensor& kpos,
                      int64_t hq, int64_t hkv, int64_t window, const Tensor& qstart,
                      float softcap) {
  NK_CHECK(qkv.ndim() == 3 && kv.ndim() == 3, "attention_block: qkv {} and kv {} must be [B,T,C]",
           qkv.desc(), kv.desc());
  NK_CHECK(hq > 0 && hkv > 0 && hq % hkv == 0, "attention_block: {} query heads, {} kv heads", hq,
           hkv);
  NK_CHECK(qkv.dim(2) % (hq + 2 * hkv) == 0, "attention_block: qkv width {} is not (Hq+2*Hkv)*D",
           qkv.dim(2));
  const BlockDims d{qkv.dim(0), qkv.dim(1), kv.dim(1), hq, hkv, qkv.dim(2) / (hq + 2 * hkv)};
  check_shape(kv, {d.B, d.Tk, 2 * hkv * d.D}, "attention_block kv");
  check_dtype(kv, qkv.dtype(), "attention_block kv");
  NK_CHECK(qkv.dtype() == DType::F32 || qkv.dtype() == DType::BF16, "attention_block: dtype {}",
           dtype_name(qkv.dtype()));
  check_shape(qpos, {d.Tq}, "attention_block qpos");
  check_shape(kpos, {d.Tk}, "attention_block kpos");
  check_dtype(qpos, DType::I32, "attention_block qpos");
  check_dtype(kpos, DType::I32, "attention_block kpos");
  NK_CHECK(window >= 0, "attention_block: window {} must be >= 0 (0 = full causal)", window);
  NK_CHECK(softcap >= 0.f, "attention_block: softcap {} must be >= 0 (0 = none)", softcap);
  if (qstart.defined()) {
    check_shape(qstart, {d.B, d.Tq}, "attention_block qstart");
    check_dtype(qstart, DType::I32, "attention_block qstart");
  }
  return d;
}

void check_running(const Tensor& out, const Tensor& lse, const BlockDims& d) {
  check_shape(out, {d.B, d.Tq, d.Hq * d.D}, "attention_block out");
  check_dtype(out, DType::F32, "attention_block out");
  check_shape(lse, {d.B, d.Hq, d.Tq}, "attention_block lse");
  check_dtype(lse, DType::F32, "attention_block lse");
}

}  // namespace

void attention_block_forward(Tensor out, Tensor lse, const Tensor& qkv, const Tensor& kv,
                             const Tensor& qpos, const Tensor& kpos, int64_t n_q_heads,
                             int64_t n_kv_heads, int64_t window, const Tensor& qstart, float scale,
                             float softcap) {
  const Device dev = device_of(
      "attention_block_forward",
      {{&out, "out"}, {&lse, "lse"}, {&qkv, "qkv"}, {&kv, "kv"}, {&qpos, "qpos"}, {&kpos, "kpos"}});
  const BlockDims d =
      check_block(qkv, kv, qpos, kpos, n_q_heads, n_kv_heads, window, qstart, softcap);
  check_running(out, lse, d);
  pick_kernel("attention_block_forward", dev, cpu_kernels().attention_block_forward)(
      out, lse, qkv, kv, qpos, kpos, n_q_heads, n_kv_heads, window, qstart, scale, softcap);
}

void attention_block_backward(Tensor dq, Tensor dkv, const Tensor& dout, const Tensor& out,
                              const Tensor& lse, const Tensor& qkv, const Tensor& kv,
                              const Tensor& qpos, const Tensor& kpos, int64_t n_q_heads,
                              int64_t n_kv_heads, int64_t window, const Tensor& qstart, float scale,
                              float softcap) {
  const Device dev = device_of("attention_block_backward", {{&dq, "dq"},
                                                            {&dkv, "dkv"},
                                                            {&dout, "dout"},
                                                            {&out, "out"},
                                                            {&lse, "lse"},
                                                            {&qkv, "qkv"},
                                                            {&kv, "kv"},
                                                            {&qpos, "qpos"},
                                                            {&kpos, "kpos"}});
  const BlockDims d =
      check_block(qkv, kv, qpos, kpos, n_q_heads, n_kv_heads, window, qstart, softcap);
  check_running(dq, lse, d);
  check_shape(dkv, kv.shape(), "attention_block dkv");
  check_dtype(dkv, DType::F32, "attention_block dkv");
  for (const auto& [t, name] :
       {std::pair{&dout, "attention_block dout"}, {&out, "attention_block out"}}) {
    check_shape(*t, {d.B, d.Tq, d.Hq * d.D}, name);
    check_dtype(*t, qkv.dtype(), name);
  }
  pick_kernel("attention_block_backward", dev, cpu_kernels().attention_block_backward)(
      dq, dkv, dout, out, lse, qkv, kv, qpos, kpos, n_q_heads, n_kv_heads, window, qstart, scale,
      softcap);
}

}  // namespace nk::ops
