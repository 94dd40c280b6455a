// Softmax cross-entropy over the vocabulary for a chunk of rows of logits,
// the vocabulary whole or split over a tensor-parallel group (Megatron's
// vocabulary-parallel cross-entropy: each rank reduces its columns to a max,
// a sum of exponentials and the target's logit per row, the group sums those,
// and each rank's backward needs only the combined log-sum-exp; the full
// logits never exist on one rank). Without tensor parallelism it is the
// fused kernel of ops.h, bit for bit.
#pragma once
#include <limits>

#include "nn/tensor_parallel.h"
#include "ops/ops.h"

namespace nk::nn {

struct VocabCrossEntropy {
  TensorParallel tp;
  int64_t vocab_start = 0;  // the first id of this rank's columns
  int64_t ignore_index = -100;

  // f32 scratch for chunks of up to n rows (tensor parallel only).
  static int64_t stats_size(int64_t n) { return 5 * n; }

  // losses f32 [n]; logits [n, Vs]: this rank's columns, ids [vocab_start,
  // vocab_start + Vs), fewer than its share where the share ends in
  // vocabulary padding, or undefined (tensor parallel only) when it holds
  // padding only: the padding's ids are never scored (-inf logits).
  // targets i32 [n] (ids of the whole vocabulary). With backward, logits are
  // overwritten by d loss_sum/d logits scaled by grad_scale ((softmax -
  // onehot) * grad_scale; 0 for ignored rows). stats: f32 of at least
  // stats_size(n) elements under tp.
  void forward(const Tensor& losses, const Tensor& logits, const Tensor& targets, bool backward,
               float grad_scale, const Tensor& stats) const {
    if (!tp.active()) {
      if (backward)
        ops::cross_entropy_forward_backward(losses, logits, logits, targets, ignore_index,
                                            grad_scale);
      else
        ops::cross_entropy_forward(losses, logits, targets, ignore_index);
      return;
    }
    const int64_t n = targets.numel();
    NK_CHECK(stats.numel() >= stats_size(n), "VocabCrossEntropy: stats of {} for {} rows",
             stats.numel(), n);
    // row max, global max, sum of exp, target logit, log-sum-exp: [n] each,
    // the sums and target logits adjacent so one all-reduce adds both.
    const Tensor mx = stats.narrow0(0, n), gmax = stats.narrow0(n, n),
                 sums = stats.narrow0(2 * n, 2 * n), lse = stats.narrow0(4 * n, n);
    const Tensor se = sums.narrow0(0, n), tl = sums.narrow0(n, n);
    if (logits.defined()) {
      ops::cross_entropy_shard_stats(mx, se, tl, logits, targets, vocab_start);
    } else {  // no columns: the statistics of an empty row
      ops::fill(mx, -std::numeric_limits<float>::infinity());
      ops::fill(se, 0.f);
      ops::fill(tl, 0.f);
    }
    ops::convert(gmax, mx);
    tp.comm->all_reduce(gmax, dist::ReduceOp::Max);
    ops::cross_entropy_rescale_stats(mx, se, gmax);
    tp.comm->all_reduce(sums);
    ops::cross_entropy_shard_finish(losses, lse, mx, se, tl, targets, ignore_index);
    if (backward && logits.defined())
      ops::cross_entropy_shard_backward(logits, logits, targets, lse, vocab_start, ignore_index,
                                        grad_scale);
  }
};

}  // namespace nk::nn
