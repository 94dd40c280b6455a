// Softmax cross-entropy over the vocabulary: checks, then the device's kernel.
// Target ids are data, checked by the kernel that reads them.
#include <algorithm>

#include "ops/dispatch.h"
#include "ops/ops.h"

namespace nk::ops {
namespace {

// logits T[..., V]; targets i32 and losses f32 with one entry per row;
// dlogits (when given) like logits.
Device check_args(const char* op, const Tensor& losses, const Tensor* dlogits, const Tensor& logits,
                  const Tensor& targets) {
  const Tensor none;
  const Device dev = device_of(op, {{&losses, "losses"},
                                    {dlogits ? dlogits : &none, "dlogits", !dlogits},
                                    {&logits, "logits"},
                                    {&targets, "targets"}});
  NK_CHECK(logits.ndim() >= 2, "cross_entropy: logits {}", logits.desc());
  NK_CHECK(logits.dtype() == DType::F32 || logits.dtype() == DType::BF16,
           "cross_entropy: logits dtype {}", dtype_name(logits.dtype()));
  const int64_t V = logits.dim(-1), N = logits.numel() / std::max<int64_t>(V, 1);
  NK_CHECK(V > 0, "cross_entropy: empty vocabulary in {}", logits.desc());
  check_dtype(targets, DType::I32, "cross_entropy targets");
  check_dtype(losses, DType::F32, "cross_entropy losses");
  NK_CHECK(targets.numel() == N, "cross_entropy: targets {} for {}", targets.desc(), logits.desc());
  NK_CHECK(losses.numel() == N, "cross_entropy: losses {} for {}", losses.desc(), logits.desc());
  if (dlogits) {
    check_shape(*dlogits, logits.shape(), "cross_entropy dlogits");
    check_dtype(*dlogits, logits.dtype(), "cross_entropy dlogits");
  }
  return dev;
}

}  // namespace

void cross_entropy_forward(Tensor losses, const Tensor& logits, const Tensor& targets,
                           int64_t ignore_index) {
  const Device dev = check_args("cross_entropy_forward", losses, nullptr, logits, targets);
  NK_KERNEL(cross_entropy_forward, dev)(losses, logits, targets, ignore_index);
}

void cross_entropy_forward_backward(Tensor losses, Tensor dlogits, const Tensor& logits,
                                    const Tensor& targets, int64_t ignore_index, float grad_scale) {
  const Device dev =
      check_args("cross_entropy_forward_backward", losses, &dlogits, logits, targets);
  NK_KERNEL(cross_entropy_forward_backward, dev)
  (losses, dlogits, logits, targets, ignore_index, grad_scale);
}

}  // namespace nk::ops
