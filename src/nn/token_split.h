// A tensor-parallel region whose ranks split the rows instead of the weights:
// a MoE block whose experts are whole on every tensor-parallel rank
// (parallel.etp = 1 < parallel.tp, Megatron-Core's expert tensor-parallel
// group decoupled from the attention's). Of the region's N rows rank r of t
// computes [r N/t, (r+1) N/t) with whole weights; under sequence
// parallelism those are the rows it holds outside the region already. The
// crossings, each paired with its backward:
//
//                       forward                          backward
//   enter   tp          this rank's rows of x (a view)   all-gather of the rows' dx
//           tp + sp     identity                         identity
//   exit    tp          all-gather of the rows' y        this rank's rows of dy
//           tp + sp     identity                         identity
//
// The weights' gradients are then partial sums over the ranks' rows (the
// trainer adds them over the group: Transformer::tensor_parallel_partial_grads),
// and so are a router's statistics, which sum() adds in the forward so that
// every rank sees the whole micro-batch's (the balancing loss is the
// micro-batch's, as on one process).
//
// Without a communicator (or with a group of one) every crossing is the
// identity.
#pragma once
#include "dist/communicator.h"

namespace nk::nn {

struct TokenSplit {
  dist::Communicator* comm = nullptr;  // the mesh's "tp" group; null: size 1
  bool sequence_parallel = false;

  int64_t size() const { return comm ? comm->size() : 1; }
  int64_t rank() const { return comm ? comm->rank() : 0; }
  bool active() const { return size() > 1; }
  // Whether the crossings move rows (tp without sp).
  bool moves() const { return active() && !sequence_parallel; }

  // x [N, C] (every row, equal on every rank) -> this rank's rows [N/t, C].
  Tensor enter(const Tensor& x) const {
    if (!moves()) return x;
    const int64_t n = x.dim(0) / size();
    return x.narrow0(rank() * n, n);
  }
  // Where the region writes this rank's rows of y [N, C]: y itself, or the
  // first N/t rows of `part` (scratch of at least N/t rows).
  Tensor exit_buffer(const Tensor& y, const Tensor& part) const {
    if (!moves()) return y;
    return part.narrow0(0, y.dim(0) / size());
  }
  // Leaving, forward: every rank's rows of `mine` (exit_buffer) into y [N, C].
  void exit(const Tensor& mine, const Tensor& y) const {
    if (moves()) comm->all_gather(mine, y);
  }
  // Leaving, backward: this rank's rows of dy.
  Tensor exit_backward(const Tensor& dy) const { return enter(dy); }
  // Where the region's backward writes this rank's rows of dx, and the
  // gather that puts every rank's into dx (enter's backward).
  Tensor enter_grad(const Tensor& dx, const Tensor& part) const { return exit_buffer(dx, part); }
  void enter_backward(const Tensor& mine, const Tensor& dx) const { exit(mine, dx); }
  // Sums of this rank's rows (f32, i64 ...) summed over the group, in place.
  void sum(const Tensor& x) const {
    if (active()) comm->all_reduce(x);
  }
};

}  // namespace nk::nn
