// Mixture-of-Experts routing and token movement (nn/moe.h builds the layer
// from these and the linear products of ops.h). N tokens, E experts, each
// token routed to k of them; the M <= N k (token, expert) pairs that are kept
// are "slots", grouped by expert so that each expert's rows are contiguous
// and one product per expert covers them.
//
// Conventions as ops.h: activations in the compute dtype T (f32 or bf16),
// arithmetic in fp32 (the router's per-row arithmetic in double), activation
// gradients written. On every backend (ops/kernel_list.h: the CPU's
// ops/cpu/moe.cc, CUDA's ops/cuda/moe.cu).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace nk::ops {

// How moe_route chooses the k experts of a row and weighs them; the
// defaults are Mixtral's.
struct MoeRouteSpec {
  bool sigmoid = false;   // scores: softmax (Mixtral, Qwen-MoE) or sigmoid (DeepSeek-V3)
  bool norm_topk = true;  // weights divided by the k scores' sum (Qwen's norm_topk_prob)
  // Group-limited routing (DeepSeek-V3's n_group / topk_group): the E experts
  // in n_group equal groups of consecutive ids; a group's score is the sum of
  // its two largest choice scores (the one when a group holds one expert);
  // the topk_group groups of largest score are kept (ties to the lower
  // group) and the k experts are chosen among theirs. 1 / 1: all experts.
  int64_t n_group = 1, topk_group = 1;
  double scaling = 1.0;  // routed_scaling_factor: the weights' factor, after the normalisation
};

// Router scores and the top-k choice, per row of logits T[N, E]:
//  probs f32[N, E]: softmax(logits) (spec.sigmoid false) or sigmoid(logits);
//  idx i32[N, k]: the k experts of largest choice score (probs + bias; the
//    score alone when bias is undefined) among the kept groups, in
//    descending order (ties to the lower expert). bias f32 or T [E] is
//    DeepSeek-V3's e_score_correction_bias: it decides the choice only;
//  weights f32[N, k]: their probs (unbiased), divided by their sum when
//    norm_topk, times spec.scaling;
//  stats f32[S, E + 1] (or [E + 1]: S = 1), the rows in S equal segments of
//    consecutive rows (S sequences: the sequence-wise balancing loss):
//    stats[s, e] = sum over the segment's rows of the balancing score of e
//    (softmax: probs; sigmoid: probs divided by the row's sum of probs), the
//    P_e of the load-balancing loss before the mean; stats[s, E] = sum over
//    its rows of logsumexp(logits row)^2, the router z-loss before the mean.
//    Deterministic (rows summed in order).
void moe_route(Tensor probs, Tensor idx, Tensor weights, Tensor stats, const Tensor& logits,
               const Tensor& bias, const MoeRouteSpec& spec);
// Mixtral-style routing (no bias, no groups, no scaling).
void moe_route(Tensor probs, Tensor idx, Tensor weights, Tensor stats, const Tensor& logits,
               bool sigmoid, bool norm_topk);
// dlogits T[N, E] (written) = d loss / d logits, from dweights f32[N, k]
// (d loss / d weights), balance_grad f32[S, E] or [E] (d loss / d balancing
// score of expert e, the same for every row of segment s, as moe_route's
// stats: the load-balancing loss's) and z_grad (d loss / d
// logsumexp(row)^2, the same for every row: the z-loss's). probs and idx are
// moe_route's for these logits and spec (the bias has no gradient: it only
// chose idx).
void moe_route_backward(Tensor dlogits, const Tensor& dweights, const Tensor& balance_grad,
                        float z_grad, const Tensor& logits, const Tensor& probs, const Tensor& idx,
                        const MoeRouteSpec& spec);
void moe_route_backward(Tensor dlogits, const Tensor& dweights, const Tensor& balance_grad,
                        float z_grad, const Tensor& logits, const Tensor& probs, const Tensor& idx,
                        bool sigmoid, bool norm_topk);
// xs T[M, C]: xs[m] = x[src[m]]; x T[N, C], src i32[M] (each in [0, N)).
void moe_gather(Tensor xs, const Tensor& x, const Tensor& src);
// y T[N, C] (written): y[n] = sum_j weights[n, j] out[slot[n, j]], summed in
// fp32 in j order; out T[M, C], slot i32[N, k] (-1: a dropped pair, adding
// nothing), weights f32[N, k].
void moe_combine(Tensor y, const Tensor& out, const Tensor& slot, const Tensor& weights);
// Its backward: dout T[M, C] (written; rows no pair names are left as they
// are) dout[slot[n, j]] = weights[n, j] dy[n]; dweights f32[N, k] (written)
// = dy[n] . out[slot[n, j]] (0 for a dropped pair).
void moe_combine_backward(Tensor dout, Tensor dweights, const Tensor& dy, const Tensor& out,
                          const Tensor& slot, const Tensor& weights);
// moe_gather's backward through the pairs: dx T[N, C] (written) dx[n] =
// sum_j dxs[slot[n, j]] (dropped pairs add nothing; a row with none is 0).
void moe_scatter(Tensor dx, const Tensor& dxs, const Tensor& slot);

}  // namespace nk::ops
