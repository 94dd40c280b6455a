// Tensor parallelism as the nn blocks see it (Megatron's layout). A
// column-parallel linear layer holds rows of its weight (some output
// features: some heads, some of the MLP's inner units, some of the
// vocabulary) and needs every rank's whole input; a row-parallel one holds
// columns (input features) and produces partial sums that the group adds.
// The blocks enter the tensor-parallel region before a column-parallel layer
// and leave it after a row-parallel one; each crossing is paired with its
// backward:
//
//                          forward                    backward
//   enter   tp             identity                   all-reduce of dx
//           tp + sp        all-gather of the rows     reduce-scatter of dx
//   exit    tp             all-reduce                 identity
//           tp + sp        reduce-scatter             all-gather of dy
//
// Under sequence parallelism (sp) the rows outside the region (norms,
// residual adds, dropout-free elementwise work) are split over the group:
// of a micro-batch's N = B·T rows, rank r holds [r·N/t, (r+1)·N/t), so an
// all-gather puts them back in order. The buffers passed as `full` hold all
// N rows ([B, T, C]); they are scratch, reused by every layer (a backward
// gathers again rather than keeping the gathered input).
//
// Without a communicator (or with a group of one) every crossing is the
// identity and the blocks are their plain selves, bit for bit.
#pragma once
#include "dist/communicator.h"

namespace nk::nn {

struct TensorParallel {
  dist::Communicator* comm = nullptr;  // the mesh's "tp" group; null: size 1
  bool sequence_parallel = false;
  // parallel.etp = 1 < parallel.tp: a MoE block's experts (router, shared
  // expert) are whole on every rank, which split the block's rows instead
  // (nn/token_split.h); the rest of the model is split as above.
  bool experts_whole = false;
  // 1 < parallel.etp < parallel.tp (Megatron-Core's expert tensor-parallel
  // size below the attention's): a MoE block's experts (and shared expert)
  // are split over `experts`, the mesh's "expert-tp" group (etp consecutive
  // tp ranks: tp rank c·etp + j is its rank j), and the block's rows over
  // `tokens`, its "expert-token" group (the tp / etp ranks c·etp + j of one
  // j, nn/token_split.h); the router is whole on every rank. Null: the
  // experts are split over the whole group (etp = tp), or whole.
  dist::Communicator* experts = nullptr;
  dist::Communicator* tokens = nullptr;

  int64_t size() const { return comm ? comm->size() : 1; }
  int64_t rank() const { return comm ? comm->rank() : 0; }
  bool active() const { return size() > 1; }
  bool sp() const { return sequence_parallel && active(); }
  // The experts' tensor-parallel split (parallel.etp) and this rank's share.
  int64_t expert_size() const { return experts_whole ? 1 : experts ? experts->size() : size(); }
  int64_t expert_rank() const { return experts_whole ? 0 : experts ? experts->rank() : rank(); }
  // Whether the experts are split over fewer ranks than the group (etp < tp):
  // the MoE blocks' rows are then split over the rest (nn/token_split.h).
  bool experts_narrower() const { return active() && expert_size() < size(); }
  // The rows this rank holds outside the region, of N: N / size() under sp.
  int64_t local_rows(int64_t N) const { return sp() ? N / size() : N; }

  // Entering, forward: the input with every row: x itself, or under sp the
  // all-gather of every rank's x [N/t, C] into full [N, C] (returned).
  Tensor enter(const Tensor& x, const Tensor& full) const {
    if (!sp()) return x;
    comm->all_gather(x, full);
    return full;
  }
  // Where a column-parallel layer's backward writes the input gradient (its
  // share of it): dx, or under sp the full rows.
  Tensor enter_grad(const Tensor& dx, const Tensor& full) const { return sp() ? full : dx; }
  // Entering, backward: the ranks' shares in enter_grad(dx, full) summed
  // into dx (all-reduce in place, or reduce-scatter of full into dx).
  void enter_backward(const Tensor& dx, const Tensor& full) const { sum_partials(dx, full); }
  // Where a row-parallel layer writes its partial sums: y, or under sp the full rows.
  Tensor exit_buffer(const Tensor& y, const Tensor& full) const { return sp() ? full : y; }
  // Leaving, forward: the partial sums in exit_buffer(y, full) added over
  // the group into y (all-reduce, or reduce-scatter into this rank's rows).
  void exit(const Tensor& y, const Tensor& full) const { sum_partials(y, full); }
  // Leaving, backward: the output gradient with every row: dy, or under sp
  // its all-gather into full.
  Tensor exit_backward(const Tensor& dy, const Tensor& full) const { return enter(dy, full); }
  // The same group for a step whose every row each rank holds: the cached
  // decode's (a batch of new tokens, not split however training splits its
  // rows), without sequence parallelism; its exit is an all-reduce.
  TensorParallel whole_rows() const {
    TensorParallel t = *this;
    t.sequence_parallel = false;
    return t;
  }

 private:
  // Every rank's partial values of x (x itself, or under sp all N rows in
  // full) summed into x (this rank's rows under sp).
  void sum_partials(const Tensor& x, const Tensor& full) const {
    if (sp())
      comm->reduce_scatter(full, x);
    else if (active())
      comm->all_reduce(x);
  }
};

}  // namespace nk::nn
