// Vocabulary-parallel cross-entropy: checks, then the device's kernel.
#include <algorithm>

#include "ops/dispatch.h"
#include "ops/ops.h"

namespace nk::ops {
namespace {

// Every per-row tensor is f32 with n entries.
void check_rows(std::initializer_list<const Tensor*> ts, int64_t n, const char* op) {
  for (const Tensor* t : ts) {
    check_dtype(*t, DType::F32, op);
    NK_CHECK(t->numel() == n, "{}: {} for {} rows", op, t->desc(), n);
  }
}

// logits T[N, Vs] (f32 or bf16) and targets i32[N]; returns N.
int64_t check_logits(const char* op, const Tensor& logits, const Tensor& targets) {
  NK_CHECK(logits.ndim() == 2 && logits.dim(1) > 0, "{}: logits {} are not [N, Vs]", op,
           logits.desc());
  NK_CHECK(logits.dtype() == DType::F32 || logits.dtype() == DType::BF16, "{}: logits dtype {}", op,
           dtype_name(logits.dtype()));
  check_dtype(targets, DType::I32, op);
  NK_CHECK(targets.numel() == logits.dim(0), "{}: targets {} for {}", op, targets.desc(),
           logits.desc());
  return logits.dim(0);
}

}  // namespace

void cross_entropy_shard_stats(Tensor row_max, Tensor sumexp, Tensor target_logit,
                               const Tensor& logits, const Tensor& targets, int64_t vocab_start) {
  const char* op = "cross_entropy_shard_stats";
  const Device dev = device_of(op, {{&row_max, "row_max"},
                                    {&sumexp, "sumexp"},
                                    {&target_logit, "target_logit"},
                                    {&logits, "logits"},
                                    {&targets, "targets"}});
  const int64_t n = check_logits(op, logits, targets);
  check_rows({&row_max, &sumexp, &target_logit}, n, op);
  NK_CHECK(vocab_start >= 0, "{}: vocab_start {}", op, vocab_start);
  NK_KERNEL(cross_entropy_shard_stats, dev)
  (row_max, sumexp, target_logit, logits, targets, vocab_start);
}

void cross_entropy_rescale_stats(Tensor row_max, Tensor sumexp, const Tensor& global_max) {
  const char* op = "cross_entropy_rescale_stats";
  const Device dev =
      device_of(op, {{&row_max, "row_max"}, {&sumexp, "sumexp"}, {&global_max, "global_max"}});
  check_rows({&row_max, &sumexp, &global_max}, row_max.numel(), op);
  NK_KERNEL(cross_entropy_rescale_stats, dev)(row_max, sumexp, global_max);
}

void cross_entropy_shard_finish(Tensor losses, Tensor lse, const Tensor& row_max,
                                const Tensor& sumexp, const Tensor& target_logit,
                                const Tensor& targets, int64_t ignore_index) {
  const char* op = "cross_entropy_shard_finish";
  const Device dev = device_of(op, {{&losses, "losses"},
                                    {&lse, "lse"},
                                    {&row_max, "row_max"},
                                    {&sumexp, "sumexp"},
                                    {&target_logit, "target_logit"},
                                    {&targets, "targets"}});
  const int64_t n = targets.numel();
  check_dtype(targets, DType::I32, op);
  check_rows({&losses, &lse, &row_max, &sumexp, &target_logit}, n, op);
  NK_KERNEL(cross_entropy_shard_finish, dev)
  (losses, lse, row_max, sumexp, target_logit, targets, ignore_index);
}

void cross_entropy_shard_backward(Tensor dlogits, const Tensor& logits, const Tensor& targets,
                                  const Tensor& lse, int64_t vocab_start, int64_t ignore_index,
                                  float grad_scale) {
  const char* op = "cross_entropy_shard_backward";
  const Device dev = device_of(
      op, {{&dlogits, "dlogits"}, {&logits, "logits"}, {&targets, "targets"}, {&lse, "lse"}});
  const int64_t n = check_logits(op, logits, targets);
  check_shape(dlogits, logits.shape(), "cross_entropy_shard_backward dlogits");
  check_dtype(dlogits, logits.dtype(), "cross_entropy_shard_backward dlogits");
  check_rows({&lse}, n, op);
  NK_CHECK(vocab_start >= 0, "{}: vocab_start {}", op, vocab_start);
  NK_KERNEL(cross_entropy_shard_backward, dev)
  (dlogits, logits, targets, lse, vocab_start, ignore_index, grad_scale);
}

}  // namespace nk::ops
