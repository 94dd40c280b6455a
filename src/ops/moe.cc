// Mixture-of-Experts routing and token movement: checks, then the tensors'
// backend's kernel (ops/moe.h). Expert and slot ids are data, checked by the kernels.
#include "ops/moe.h"

#include <cmath>

#include "ops/dispatch.h"

namespace nk::ops {
namespace {

void check_2d(const Tensor& t, int64_t rows, int64_t cols, const char* name) {
  check_shape(t, {rows, cols}, name);
}

// x, y, dx, dy... in the compute dtype with C columns.
void check_rows(const char* op, const Tensor& t, DType dt, int64_t C, const char* name) {
  NK_CHECK(t.ndim() == 2 && t.dim(1) == C && t.dtype() == dt, "{}: {} is {}, expected {}[*, {}]",
           op, name, t.desc(), dtype_name(dt), C);
}

// The routing choices for E experts, k per row.
void check_spec(const char* op, const MoeRouteSpec& s, int64_t E, int64_t k) {
  NK_CHECK(s.n_group >= 1 && E % s.n_group == 0, "{}: {} groups do not divide the {} experts", op,
           s.n_group, E);
  NK_CHECK(s.topk_group >= 1 && s.topk_group <= s.n_group, "{}: keeps {} of {} groups", op,
           s.topk_group, s.n_group);
  NK_CHECK(k <= s.topk_group * (E / s.n_group), "{}: top-{} among the {} experts of {} kept groups",
           op, k, s.topk_group * (E / s.n_group), s.topk_group);
  NK_CHECK(std::isfinite(s.scaling) && s.scaling > 0, "{}: scaling {}", op, s.scaling);
}

// Per-segment values: [S, cols] with S dividing the N rows, or [cols] (S = 1).
void check_segments(const char* op, const Tensor& t, int64_t N, int64_t cols, const char* name) {
  const bool one = t.ndim() == 1 && t.dim(0) == cols;
  const bool per = t.ndim() == 2 && t.dim(1) == cols && t.dim(0) >= 1 && N % t.dim(0) == 0;
  NK_CHECK(one || per, "{}: {} is {}, expected [{}] or [S, {}] with S dividing {} rows", op, name,
           t.desc(), cols, cols, N);
}

}  // namespace

void moe_route(Tensor probs, Tensor idx, Tensor weights, Tensor stats, const Tensor& logits,
               const Tensor& bias, const MoeRouteSpec& spec) {
  const char* op = "moe_route";
  const Device dev = device_of(op, {{&probs, "probs"},
                                    {&idx, "idx"},
                                    {&weights, "weights"},
                                    {&stats, "stats"},
                                    {&logits, "logits"},
                                    {&bias, "bias", kOptional}});
  NK_CHECK(logits.ndim() == 2 && (logits.dtype() == DType::F32 || logits.dtype() == DType::BF16),
           "{}: logits {} is not f32/bf16 [N, E]", op, logits.desc());
  const int64_t N = logits.dim(0), E = logits.dim(1);
  NK_CHECK(idx.ndim() == 2 && idx.dim(0) == N && idx.dim(1) >= 1 && idx.dim(1) <= E,
           "{}: idx {} is not [{}, k <= {}]", op, idx.desc(), N, E);
  const int64_t k = idx.dim(1);
  check_spec(op, spec, E, k);
  check_dtype(idx, DType::I32, "idx");
  check_2d(probs, N, E, "probs");
  check_dtype(probs, DType::F32, "probs");
  check_2d(weights, N, k, "weights");
  check_dtype(weights, DType::F32, "weights");
  check_segments(op, stats, N, E + 1, "stats");
  check_dtype(stats, DType::F32, "stats");
  if (bias.defined()) {
    check_shape(bias, {E}, "bias");
    NK_CHECK(bias.dtype() == DType::F32 || bias.dtype() == logits.dtype(),
             "{}: bias {} is neither f32 nor the logits' {}", op, bias.desc(),
             dtype_name(logits.dtype()));
  }
  NK_KERNEL(moe_route, dev)(probs, idx, weights, stats, logits, bias, spec);
}

void moe_route(Tensor probs, Tensor idx, Tensor weights, Tensor stats, const Tensor& logits,
               bool sigmoid, bool norm_topk) {
  MoeRouteSpec spec;
  spec.sigmoid = sigmoid;
  spec.norm_topk = norm_topk;
  moe_route(probs, idx, weights, stats, logits, Tensor(), spec);
}

void moe_route_backward(Tensor dlogits, const Tensor& dweights, const Tensor& balance_grad,
                        float z_grad, const Tensor& logits, const Tensor& probs, const Tensor& idx,
                        const MoeRouteSpec& spec) {
  const char* op = "moe_route_backward";
  const Device dev = device_of(op, {{&dlogits, "dlogits"},
                                    {&dweights, "dweights"},
                                    {&balance_grad, "balance_grad"},
                                    {&logits, "logits"},
                                    {&probs, "probs"},
                                    {&idx, "idx"}});
  NK_CHECK(logits.ndim() == 2 && idx.ndim() == 2, "{}: logits {} / idx {} are not 2-d", op,
           logits.desc(), idx.desc());
  const int64_t N = logits.dim(0), E = logits.dim(1), k = idx.dim(1);
  check_spec(op, spec, E, k);
  check_shape(dlogits, logits.shape(), "dlogits");
  check_dtype(dlogits, logits.dtype(), "dlogits");
  check_2d(probs, N, E, "probs");
  check_dtype(probs, DType::F32, "probs");
  check_2d(idx, N, k, "idx");
  check_dtype(idx, DType::I32, "idx");
  check_2d(dweights, N, k, "dweights");
  check_dtype(dweights, DType::F32, "dweights");
  check_segments(op, balance_grad, N, E, "balance_grad");
  check_dtype(balance_grad, DType::F32, "balance_grad");
  NK_KERNEL(moe_route_backward, dev)
  (dlogits, dweights, balance_grad, z_grad, logits, probs, idx, spec);
}

void moe_route_backward(Tensor dlogits, const Tensor& dweights, const Tensor& balance_grad,
                        float z_grad, const Tensor& logits, const Tensor& probs, const Tensor& idx,
                        bool sigmoid, bool norm_topk) {
  MoeRouteSpec spec;
  spec.sigmoid = sigmoid;
  spec.norm_topk = norm_topk;
  moe_route_backward(dlogits, dweights, balance_grad, z_grad, logits, probs, idx, spec);
}

void moe_gather(Tensor xs, const Tensor& x, const Tensor& src) {
  const char* op = "moe_gather";
  const Device dev = device_of(op, {{&xs, "xs"}, {&x, "x"}, {&src, "src"}});
  NK_CHECK(x.ndim() == 2, "{}: x {} is not [N, C]", op, x.desc());
  check_rows(op, xs, x.dtype(), x.dim(1), "xs");
  check_shape(src, {xs.dim(0)}, "src");
  check_dtype(src, DType::I32, "src");
  NK_KERNEL(moe_gather, dev)(xs, x, src);
}

void moe_combine(Tensor y, const Tensor& out, const Tensor& slot, const Tensor& weights) {
  const char* op = "moe_combine";
  const Device dev =
      device_of(op, {{&y, "y"}, {&out, "out"}, {&slot, "slot"}, {&weights, "weights"}});
  NK_CHECK(y.ndim() == 2 && slot.ndim() == 2, "{}: y {} / slot {} are not 2-d", op, y.desc(),
           slot.desc());
  check_rows(op, out, y.dtype(), y.dim(1), "out");
  check_2d(slot, y.dim(0), slot.dim(1), "slot");
  check_dtype(slot, DType::I32, "slot");
  check_shape(weights, slot.shape(), "weights");
  check_dtype(weights, DType::F32, "weights");
  NK_KERNEL(moe_combine, dev)(y, out, slot, weights);
}

void moe_combine_backward(Tensor dout, Tensor dweights, const Tensor& dy, const Tensor& out,
                          const Tensor& slot, const Tensor& weights) {
  const char* op = "moe_combine_backward";
  const Device dev = device_of(op, {{&dout, "dout"},
                                    {&dweights, "dweights"},
                                    {&dy, "dy"},
                                    {&out, "out"},
                                    {&slot, "slot"},
                                    {&weights, "weights"}});
  NK_CHECK(dy.ndim() == 2 && slot.ndim() == 2 && slot.dim(0) == dy.dim(0),
           "{}: dy {} / slot {} are not [N, C] / [N, k]", op, dy.desc(), slot.desc());
  check_rows(op, out, dy.dtype(), dy.dim(1), "out");
  check_shape(dout, out.shape(), "dout");
  check_dtype(dout, out.dtype(), "dout");
  check_dtype(slot, DType::I32, "slot");
  check_shape(weights, slot.shape(), "weights");
  check_dtype(weights, DType::F32, "weights");
  check_shape(dweights, slot.shape(), "dweights");
  check_dtype(dweights, DType::F32, "dweights");
  NK_KERNEL(moe_combine_backward, dev)(dout, dweights, dy, out, slot, weights);
}

void moe_scatter(Tensor dx, const Tensor& dxs, const Tensor& slot) {
  const char* op = "moe_scatter";
  const Device dev = device_of(op, {{&dx, "dx"}, {&dxs, "dxs"}, {&slot, "slot"}});
  NK_CHECK(dx.ndim() == 2 && slot.ndim() == 2 && slot.dim(0) == dx.dim(0),
           "{}: dx {} / slot {} are not [N, C] / [N, k]", op, dx.desc(), slot.desc());
  check_rows(op, dxs, dx.dtype(), dx.dim(1), "dxs");
  check_dtype(slot, DType::I32, "slot");
  NK_KERNEL(moe_scatter, dev)(dx, dxs, slot);
}

}  // namespace nk::ops
