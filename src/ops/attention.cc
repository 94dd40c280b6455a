// Causal grouped-query attention over packed qkv, optionally over packed rows
// (cu_seqlens) and a sliding window: checks, then the device's kernel. The
// document boundaries are data, checked by the kernel that reads them.
#include <cmath>

#include "ops/dispatch.h"
#include "ops/ops.h"

namespace nk::ops {
namespace {

struct Dims {
  int64_t B, T, Hq, Hkv, D;
};

Dims check_qkv(const Tensor& qkv, int64_t hq, int64_t hkv, const Tensor& cu, int64_t window) {
  NK_CHECK(qkv.ndim() == 3, "attention: qkv {} must be [B,T,C]", qkv.desc());
  NK_CHECK(hq > 0 && hkv > 0 && hq % hkv == 0, "attention: {} query heads, {} kv heads", hq, hkv);
  const int64_t c = qkv.dim(2);
  NK_CHECK(c % (hq + 2 * hkv) == 0, "attention: qkv width {} is not (Hq+2*Hkv)*D", c);
  NK_CHECK(qkv.dtype() == DType::F32 || qkv.dtype() == DType::BF16, "attention: dtype {}",
           dtype_name(qkv.dtype()));
  NK_CHECK(window >= 0, "attention: window {} must be >= 0 (0 = full causal)", window);
  if (cu.defined()) {
    check_dtype(cu, DType::I32, "attention cu_seqlens");
    NK_CHECK(cu.ndim() == 2 && cu.dim(0) == qkv.dim(0) && cu.dim(1) >= 2,
             "attention: cu_seqlens {} must be [B={}, S+1] with S >= 1", cu.desc(), qkv.dim(0));
  }
  return {qkv.dim(0), qkv.dim(1), hq, hkv, c / (hq + 2 * hkv)};
}

void check_out(const Tensor& t, const Tensor& qkv, const Dims& d, const char* name) {
  check_shape(t, {d.B, d.T, d.Hq * d.D}, name);
  check_dtype(t, qkv.dtype(), name);
}

void check_lse(const Tensor& lse, const Dims& d) {
  check_shape(lse, {d.B, d.Hq, d.T}, "attention lse");
  check_dtype(lse, DType::F32, "attention lse");
}

void check_scores(float scale, float softcap) {
  NK_CHECK(scale >= 0 && std::isfinite(scale), "attention: scale {} must be >= 0 (0: 1/sqrt(D))",
           scale);
  NK_CHECK(softcap >= 0 && std::isfinite(softcap), "attention: softcap {} must be >= 0 (0: none)",
           softcap);
}

}  // namespace

void attention_forward(Tensor out, Tensor lse, const Tensor& qkv, int64_t n_q_heads,
                       int64_t n_kv_heads, const Tensor& cu_seqlens, int64_t window, float scale,
                       float softcap) {
  const Device dev = device_of(
      "attention_forward",
      {{&out, "out"}, {&lse, "lse"}, {&qkv, "qkv"}, {&cu_seqlens, "cu_seqlens", kOptional}});
  const Dims d = check_qkv(qkv, n_q_heads, n_kv_heads, cu_seqlens, window);
  check_out(out, qkv, d, "attention out");
  check_lse(lse, d);
  check_scores(scale, softcap);
  NK_KERNEL(attention_forward, dev)
  (out, lse, qkv, n_q_heads, n_kv_heads, cu_seqlens, window, scale, softcap);
}

void attention_backward(Tensor dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, int64_t n_q_heads, int64_t n_kv_heads,
                        const Tensor& cu_seqlens, int64_t window, float scale, float softcap) {
  const Device dev = device_of("attention_backward", {{&dqkv, "dqkv"},
                                                      {&dout, "dout"},
                                                      {&qkv, "qkv"},
                                                      {&out, "out"},
                                                      {&lse, "lse"},
                                                      {&cu_seqlens, "cu_seqlens", kOptional}});
  const Dims d = check_qkv(qkv, n_q_heads, n_kv_heads, cu_seqlens, window);
  check_out(dout, qkv, d, "attention dout");
  check_out(out, qkv, d, "attention out");
  check_shape(dqkv, qkv.shape(), "attention dqkv");
  check_dtype(dqkv, qkv.dtype(), "attention dqkv");
  check_lse(lse, d);
  check_scores(scale, softcap);
  NK_KERNEL(attention_backward, dev)
  (dqkv, dout, qkv, out, lse, n_q_heads, n_kv_heads, cu_seqlens, window, scale, softcap);
}

}  // namespace nk::ops
