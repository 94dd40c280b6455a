// Mixture-of-Experts feed-forward block (Mixtral's sparse MoE): a router
// (linear, no bias) scores the E experts per token, each token goes to its
// top k (weights: the scores, renormalised over the k when norm_topk), each
// expert is a SwiGLU MLP, and the output is the weighted sum of the k
// experts' outputs. Experts run as grouped products: the (token, expert)
// pairs are sorted by expert (a counting sort on the host, stable in token
// order), the tokens' rows gathered so that each expert's rows are
// contiguous, one product per expert over its rows, and the weighted outputs
// scattered back (ops/moe.h). Dropless (capacity_factor 0): every pair is
// computed (M = N k). With a capacity factor each expert computes at most
// ceil(capacity_factor N k / E) pairs, the first ones in token order
// (GShard's and Switch's dropping by position); a dropped pair adds nothing
// to its token's output (its weight is not renormalised away) and gets no
// gradient. The balancing loss counts the pairs as routed, before dropping.
//
// Weights: up [E 2F, C], expert e's fused [gate | up] at rows [2F e, 2F e +
// 2F); down [E C, F], expert e's at rows [C e, C e + C). Gradients f32,
// accumulated; undefined when frozen. Held block-quantised (inference
// only: up_q and down_q, one list of runs per expert, slices of the stacked
// weight's bytes) each expert's product reads only its own blocks, so a
// decode step reads the k routed experts' weights and no other's. Held as
// NF4 (QLoRA's frozen base: up_nf4 and down_nf4, one weight per expert),
// the products and the backward's input gradients read each expert's own.
// Under expert parallelism up and down
// may hold only this rank's E/ep experts ([E/ep 2F, C], [E/ep C, F], local
// expert j at j's rows): the split layout a trainer uses.
//
// Expert parallelism (ep, nn/expert_parallel.h): the gathered rows go to the
// ranks of their experts and come back computed; this rank runs only its
// E/ep experts' products, over every rank's rows for them (R of them, at
// most ep N k: the buffers of the products are sized for that).
//
// The load-balancing and z-losses are the model's (they sum over layers,
// model/transformer.cc): forward leaves the per-expert routed counts and
// stats (ops::moe_route) in Saved::routing; backward takes d loss / d
// balancing score per expert (balance_grad) and d loss / d lse^2 (z_grad).
// With Saved::segments = S > 1 (the sequence-wise balancing loss) the stats
// and balance_grad are per segment of N / S consecutive rows: [S, E + 1] and
// [S, E].
//
// DeepSeek-V3's routing (ops::MoeRouteSpec): group-limited top-k, a scaling
// of the weights, and `bias` [E], the expert score-correction bias that only
// chooses (aux-loss-free balancing: the trainer moves it after each step;
// it has no gradient).
//
// Shared expert (Qwen2-MoE, DeepSeek): with shared.d_ff > 0 every token also
// goes through one SwiGLU MLP of that width, added to the routed experts'
// sum; with a shared gate (Qwen2-MoE's shared_expert_gate, w [1, C]) scaled
// by sigmoid(x . w) first. The gate is a one-expert sigmoid router, so it
// runs on ops::moe_route (E = k = 1, not renormalised) and its product with
// the shared output on ops::moe_combine (slot n for token n).
//
// Tensor parallelism (tp, nn/tensor_parallel.h; Megatron-Core's expert
// tensor parallelism with etp = tp): the block is one tensor-parallel
// region. Every rank of the group routes the same rows (all N of them,
// gathered under sequence parallelism) with the same, whole router, so the
// ranks' routings, exchanges and balancing statistics are equal; each
// expert (and the shared expert) is split as a SwiGLU MLP is: up holds this
// rank's share of every expert's gate and up units ([E 2F/t, C] with d_ff
// = F/t), down the same columns ([E C, F/t]). The experts' outputs, hence y,
// are partial sums that leave the region summed over the group; in the
// backward the combine weights' gradient (dy . out per pair, f32 [N, k]:
// the only product of a partial output with a replicated value) is summed
// over the group before the router's backward, so the router's gradient is
// the whole one on every rank, and the router's (and shared gate's) input
// gradient, equal on every rank, is added by rank 0 alone before the
// group sums dx. With expert parallelism too each rank dispatches over its
// ep group, whose members hold the same tp rank's shares.
//
// Expert tensor parallelism narrower than the attention's (1 < etp < tp,
// nn::TensorParallel::experts): tp is then the etp ranks' "expert-tp"
// group and split the tp / etp ranks of "expert-token"; the two compose,
// the token split inside the tensor-parallel region: each expert-tp group
// computes its own share of the rows (without sequence parallelism 1 /
// (tp / etp) of them; with it its etp ranks' own rows, gathered) with its
// shares of the experts, the partial sums leave summed over expert-tp and
// the rows gathered over expert-token.
//
// LoRA (nn/adapters.h, model/peft.h): each expert may carry its own adapters
// on its up (its gate and up parts, each its own A and B) and down
// products, applied to the rows it received; the shared expert's are on its
// Linear layers. Their activations are Saved's *_adapters: an expert's rows
// [r0, r0 + n) keep theirs at [r0 S, (r0 + n) S) of up_adapters.h (S: the
// most parts x rank of any expert's adapters).
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "nn/expert_parallel.h"
#include "nn/linear.h"
#include "nn/tensor_parallel.h"
#include "nn/token_split.h"
#include "ops/moe.h"

namespace nk::nn {

// Host-side routing of one forward: what the grouped products need to know
// (the rows of each expert) and the router statistics, in host memory sized
// once for N tokens.
struct MoeRouting {
  std::vector<int32_t> idx;             // [N k] copy of the chosen experts
  std::vector<int32_t> src;             // [M] token row of each slot, grouped by expert
  std::vector<int32_t> slot;            // [N k] slot of each (token, choice)
  std::vector<int64_t> count;           // [E] pairs routed to each expert (before dropping); under
                                        // a TokenSplit every rank's (the micro-batch's)
  std::vector<int64_t> kept;            // [E] slots of each expert (after dropping)
  int64_t slots = 0;                    // M: the kept pairs
  int64_t dropped = 0;                  // pairs dropped (of the split group's rows: see count)
  std::vector<float> stats;             // [S (E + 1)] ops::moe_route's stats
  std::vector<int64_t> next, next_end;  // [E] the sort's scratch
  int64_t rows = 0;                     // N of the last forward
};

struct MoE {
  Linear router;    // w [E, C]
  Tensor up, down;  // see above
  Tensor dup, ddown;
  // Block-quantised experts (ops/quant.h; up and down undefined then): expert
  // e's rows of up and of down as runs (ops::quant_slice_rows).
  std::vector<std::vector<ops::QuantWeight>> up_q, down_q;
  // NF4 experts (QLoRA's frozen base; up and down undefined then): expert
  // e's up [2F, C] and down [C, F], each quantised on its own.
  std::vector<ops::Nf4Weight> up_nf4, down_nf4;
  int64_t n_experts = 0, top_k = 0, d_ff = 0;
  bool sigmoid = false, norm_topk = true;
  int64_t n_group = 1, topk_group = 1;  // group-limited routing (ops::MoeRouteSpec)
  double scaling = 1.0;                 // routed_scaling_factor
  Tensor bias;                          // [E] e_score_correction_bias (undefined: none)
  ops::MoeRouteSpec spec() const {
    ops::MoeRouteSpec r;
    r.sigmoid = sigmoid;
    r.norm_topk = norm_topk;
    r.n_group = n_group;
    r.topk_group = topk_group;
    r.scaling = scaling;
    return r;
  }
  double capacity_factor = 0;  // 0: dropless
  // The shared expert (see the file comment); shared_d_ff 0: none. Its up
  // [2 Fs, C] is a fused [gate | up]; gate.w undefined: no gate.
  Linear shared_up, shared_down, shared_gate;
  int64_t shared_d_ff = 0;
  ExpertParallel ep;  // the expert-parallel group (size 1: none)
  TensorParallel tp;  // the (expert) tensor-parallel group (size 1: none)
  // Whole experts under tensor parallelism (parallel.etp = 1 < tp; tp is
  // then size 1): the tp group's ranks split the block's rows instead
  // (nn/token_split.h); the routing statistics (stats, count, dropped) are
  // summed over it, so they are the micro-batch's on every rank.
  TokenSplit split;
  // Each expert's LoRA ([E], or empty: none) on its up and down products.
  std::vector<Lora> up_lora, down_lora;

  // One forward's activations for up to N tokens (M = N k slots).
  struct Saved {
    Tensor logits;   // T [N, E]
    Tensor probs;    // f32 [N, E]
    Tensor idx;      // i32 [N, k]
    Tensor weights;  // f32 [N, k]
    Tensor stats;    // f32 [E + 1], or [S, E + 1] per segment
    Tensor src;      // i32 [M]
    Tensor slot;     // i32 [N, k]
    Tensor xs;       // T [M, C] gathered inputs
    Tensor h;        // T [R, 2F]
    Tensor a;        // T [R, F]
    Tensor out;      // T [M, C] experts' outputs before weighting
    std::shared_ptr<MoeRouting> routing;
    int64_t segments = 1;  // S: the stats' segments of the N rows
    // The shared expert's (undefined without): its activations like
    // nn::MLP's, its output before the gate, and the gate's routing.
    Tensor sh_h, sh_a, sh_out;                                     // T [N, 2Fs], [N, Fs], [N, C]
    Tensor gate_logits, gate_probs, gate_idx, gate_w, gate_stats;  // [N, 1] each, f32 [2]
    Tensor gate_slot, gate_y;                                      // i32 [N, 1]: n; T [N, C]
    // Expert parallel (R = ep M rows; else xe is xs, ye is out, R = M):
    Tensor xe, ye;  // T [R, C] this rank's experts' inputs and outputs, by expert
    Tensor stage;   // T [R, C] scratch of the exchanges
    std::shared_ptr<ExpertExchange> exchange;  // null without expert parallelism
    // LoRA's (undefined without): the experts' up and down, the shared expert's.
    AdapterActs up_adapters, down_adapters, shared_up_adapters, shared_down_adapters;
    Tensor full_x, full_y;  // sequence parallel: [N, C] scratch shared by every layer
  };
  struct Scratch {
    Tensor dlogits;       // T [N, E]
    Tensor dweights;      // f32 [N, k]
    Tensor balance_grad;  // f32 [E], or [S, E]
    Tensor dout, dxs;     // T [M, C]
    Tensor dh;            // T [R, 2F]
    Tensor da;            // T [R, F]
    Tensor dx_router;     // T [N, C]
    // The shared expert's (undefined without).
    Tensor sh_dout, sh_dh, sh_da;                // T [N, C], [N, 2Fs], [N, Fs]
    Tensor gate_dw, gate_dlogits, gate_balance;  // f32 [N, 1], T [N, 1], f32 [1] zero
    Tensor dye, dxe;                             // T [R, C] expert parallel (else dout, dxs)
    Tensor stage;                                // T [R, C] expert parallel
    Tensor dx_full;  // T [N, C] sequence parallel: dx's partial sums over every row
  };
  // The shared expert's buffers in s and g (either may be null) for up to
  // N tokens; gate: with a shared gate.
  template <typename Alloc>
  static void add_shared(Saved* s, Scratch* g, int64_t N, int64_t C, int64_t Fs, bool gate,
                         DType dt, Alloc&& alloc) {
    if (s) {
      s->sh_h = alloc(Shape{N, 2 * Fs}, dt);
      s->sh_a = alloc(Shape{N, Fs}, dt);
      s->sh_out = alloc(Shape{N, C}, dt);
    }
    if (s && gate) {
      s->gate_logits = alloc(Shape{N, 1}, dt);
      s->gate_probs = alloc(Shape{N, 1}, DType::F32);
      s->gate_idx = alloc(Shape{N, 1}, DType::I32);
      s->gate_w = alloc(Shape{N, 1}, DType::F32);
      s->gate_stats = alloc(Shape{2}, DType::F32);
      s->gate_slot = alloc(Shape{N, 1}, DType::I32);
      s->gate_y = alloc(Shape{N, C}, dt);
      std::vector<int32_t> iota(static_cast<size_t>(N));
      for (int64_t n = 0; n < N; ++n) iota[size_t(n)] = int32_t(n);
      ops::copy_bytes_from_host(s->gate_slot, iota.data());
    }
    if (!g) return;
    g->sh_dout = alloc(Shape{N, C}, dt);
    g->sh_dh = alloc(Shape{N, 2 * Fs}, dt);
    g->sh_da = alloc(Shape{N, Fs}, dt);
    if (gate) {
      g->gate_dw = alloc(Shape{N, 1}, DType::F32);
      g->gate_dlogits = alloc(Shape{N, 1}, dt);
      g->gate_balance = alloc(Shape{1}, DType::F32);
      ops::fill(g->gate_balance, 0.f);
    }
  }
  // Buffers for up to N tokens; alloc(shape, dtype) allocates one tensor.
  // ep: the expert-parallel size; segments: see the file comment (a
  // forward's N must be a multiple).
  template <typename Alloc>
  static Saved saved_for(int64_t N, int64_t C, int64_t E, int64_t k, int64_t F, DType dt,
                         Alloc&& alloc, int64_t ep = 1, int64_t segments = 1) {
    Saved s;
    const int64_t M = N * k, R = ep * M;
    s.logits = alloc(Shape{N, E}, dt);
    s.probs = alloc(Shape{N, E}, DType::F32);
    s.idx = alloc(Shape{N, k}, DType::I32);
    s.weights = alloc(Shape{N, k}, DType::F32);
    s.stats = alloc(segments > 1 ? Shape{segments, E + 1} : Shape{E + 1}, DType::F32);
    s.segments = segments;
    s.src = alloc(Shape{M}, DType::I32);
    s.slot = alloc(Shape{N, k}, DType::I32);
    s.xs = alloc(Shape{M, C}, dt);
    s.h = alloc(Shape{R, 2 * F}, dt);
    s.a = alloc(Shape{R, F}, dt);
    s.out = alloc(Shape{M, C}, dt);
    s.xe = s.xs;
    s.ye = s.out;
    if (ep > 1) {
      s.xe = alloc(Shape{R, C}, dt);
      s.ye = alloc(Shape{R, C}, dt);
      s.stage = alloc(Shape{R, C}, dt);
      s.exchange = ExpertExchange::make(R, E, alloc);
    }
    s.routing = std::make_shared<MoeRouting>();
    MoeRouting& r = *s.routing;
    r.idx.resize(size_t(N * k));
    r.src.resize(size_t(M));
    r.slot.resize(size_t(N * k));
    r.count.resize(size_t(E));
    r.kept.resize(size_t(E));
    r.stats.resize(size_t(segments * (E + 1)));
    r.next.resize(size_t(E));
    r.next_end.resize(size_t(E));
    return s;
  }
  template <typename Alloc>
  static Scratch scratch_for(int64_t N, int64_t C, int64_t E, int64_t k, int64_t F, DType dt,
                             Alloc&& alloc, int64_t ep = 1, int64_t segments = 1) {
    Scratch g;
    const int64_t M = N * k, R = ep * M;
    g.dlogits = alloc(Shape{N, E}, dt);
    g.dweights = alloc(Shape{N, k}, DType::F32);
    g.balance_grad = alloc(segments > 1 ? Shape{segments, E} : Shape{E}, DType::F32);
    g.dout = alloc(Shape{M, C}, dt);
    g.dxs = alloc(Shape{M, C}, dt);
    g.dh = alloc(Shape{R, 2 * F}, dt);
    g.da = alloc(Shape{R, F}, dt);
    g.dx_router = alloc(Shape{N, C}, dt);
    g.dye = g.dout;
    g.dxe = g.dxs;
    if (ep > 1) {
      g.dye = alloc(Shape{R, C}, dt);
      g.dxe = alloc(Shape{R, C}, dt);
      g.stage = alloc(Shape{R, C}, dt);
    }
    return g;
  }

  // x [N, C] -> y [N, C] (N = x's rows, at most the Saved's). Under tensor
  // parallelism x and y are the region's outside (this rank's rows [N/t, C]
  // under sequence parallelism).
  void forward(Tensor y, const Saved& s, const Tensor& x) const {
    forward_over(tp, split, y, s, x, /*dropless=*/false);
  }
  // The cached decode's: x, y [N, C] every row on every rank (no sequence
  // parallelism; s.full_x, s.full_y unused), dropless (a step's few tokens
  // would otherwise be dropped for another sequence's sake). Under tensor
  // parallelism each rank routes all N rows with its share of every expert
  // (the rows are not split over expert-token ranks), the partial sums
  // all-reduced over the experts' group. Not over expert-parallel ranks
  // (each would need every other's tokens of the same step).
  void forward_cached(Tensor y, const Saved& s, const Tensor& x) const {
    NK_CHECK(!ep.active(), "MoE: the cached decode over {} expert-parallel ranks", ep.size());
    forward_over(tp.whole_rows(), TokenSplit{}, y, s, x, /*dropless=*/true);
  }
  // Either of them over the tensor-parallel group `t` and the row split `sp`;
  // dropless: ignore capacity_factor.
  void forward_over(const TensorParallel& t, const TokenSplit& sp, Tensor y, const Saved& s,
                    const Tensor& x, bool dropless) const {
    const Tensor x1 = rows(t.enter(x, region(t, s.full_x, x))),
                 y1 = rows(t.exit_buffer(y, region(t, s.full_y, y)));
    NK_CHECK(!sp.moves() || s.full_y.defined(), "MoE: split rows without their scratch");
    const Tensor x2 = sp.enter(x1), y2 = sp.exit_buffer(y1, sp.moves() ? rows(s.full_y) : y1);
    const int64_t N = x2.dim(0);
    const Tensor logits = s.logits.narrow0(0, N), probs = s.probs.narrow0(0, N),
                 idx = s.idx.narrow0(0, N), w = s.weights.narrow0(0, N),
                 slot = s.slot.narrow0(0, N);
    router.forward(logits, x2);
    ops::moe_route(probs, idx, w, s.stats, logits, bias, spec());
    route_on_host(*s.routing, idx, N, dropless ? 0.0 : capacity_factor);
    const int64_t M = s.routing->slots;
    ops::copy_bytes_from_host(s.src.narrow0(0, M), s.routing->src.data());
    ops::copy_bytes_from_host(slot, s.routing->slot.data());
    if (sp.active()) sum_routing(sp, s);
    ops::copy_bytes_to_host(s.stats, s.routing->stats.data());
    ops::moe_gather(s.xs.narrow0(0, M), x2, s.src.narrow0(0, M));
    if (!ep.active()) {
      experts_forward(s.xs, s.h, s.a, s.out, s.routing->kept, 0, s);
    } else {
      check_expert_parallel(s.exchange.get());
      const ExpertExchange& xc = *s.exchange;
      ep.plan(*s.exchange, s.routing->kept);
      ep.dispatch(xc, s.xs.narrow0(0, M), s.xe, s.stage);
      experts_forward(s.xe, s.h, s.a, s.ye, xc.local_rows, first_held_expert(), s);
      ep.combine(xc, s.ye, s.out.narrow0(0, M), s.stage);
    }
    ops::moe_combine(y2, s.out.narrow0(0, M), slot, w);
    if (shared_d_ff > 0) shared_forward(y2, s, x2);
    sp.exit(y2, y1);
    t.exit(y, region(t, s.full_y, y));
  }
  // dx [N, C] written; the weights' and the router's gradients accumulate.
  // balance_grad [E] or [S E] (host) and z_grad: see the file comment.
  void backward(Tensor dx, const Tensor& dy, const Saved& s, const Scratch& g, const Tensor& x,
                const std::vector<float>& balance_grad, float z_grad) const {
    NK_CHECK(!tp.sp() || g.dx_full.defined(), "MoE: sequence parallel without its dx buffer");
    NK_CHECK(!split.moves() || g.dx_full.defined(), "MoE: split rows without their dx buffer");
    const Tensor dy1 = rows(tp.exit_backward(dy, region(tp, s.full_y, dy))),
                 x1 = rows(tp.enter(x, region(tp, s.full_x, x))),
                 dx1 = rows(tp.enter_grad(dx, region(tp, g.dx_full, dx)));
    const Tensor dy2 = split.exit_backward(dy1), x2 = split.enter(x1),
                 dx2 = split.enter_grad(dx1, split.moves() ? rows(g.dx_full) : dx1);
    const MoeRouting& r = *s.routing;
    const int64_t N = x2.dim(0), M = r.slots;
    NK_CHECK(up_q.empty() && down_q.empty(),
             "MoE: block-quantised experts have no backward (inference only)");
    NK_CHECK(r.rows == N, "MoE backward: {} rows after a forward of {}", N, r.rows);
    const Tensor w = s.weights.narrow0(0, N), slot = s.slot.narrow0(0, N),
                 dwt = g.dweights.narrow0(0, N);
    ops::moe_combine_backward(g.dout.narrow0(0, M), dwt, dy2, s.out.narrow0(0, M), slot, w);
    if (tp.active()) tp.comm->all_reduce(dwt);  // out holds this rank's partial sums
    if (!ep.active()) {
      experts_backward(g.dxs, g.dh, g.da, g.dout, s.xs, s.h, s.a, r.kept, 0, s);
    } else {
      // The outputs' gradients go where the inputs went; the inputs' come back.
      const ExpertExchange& xc = *s.exchange;
      ep.dispatch(xc, g.dout.narrow0(0, M), g.dye, g.stage);
      experts_backward(g.dxe, g.dh, g.da, g.dye, s.xe, s.h, s.a, xc.local_rows, first_held_expert(),
                       s);
      ep.combine(xc, g.dxe, g.dxs.narrow0(0, M), g.stage);
    }
    ops::moe_scatter(dx2, g.dxs.narrow0(0, M), slot);
    NK_CHECK(int64_t(balance_grad.size()) == g.balance_grad.numel(),
             "MoE backward: {} balance gradients for {}", balance_grad.size(),
             g.balance_grad.desc());
    ops::copy_from_host(g.balance_grad, balance_grad.data());
    const Tensor dlogits = g.dlogits.narrow0(0, N);
    ops::moe_route_backward(dlogits, dwt, g.balance_grad, z_grad, s.logits.narrow0(0, N),
                            s.probs.narrow0(0, N), s.idx.narrow0(0, N), spec());
    const Tensor dxr = g.dx_router.narrow0(0, N);
    router.backward(dxr, dlogits, x2);
    if (tp.rank() == 0) ops::accumulate(dx2, dxr);  // equal on every rank: added once
    if (shared_d_ff > 0) shared_backward(dx2, dy2, s, g, x2);
    // The crossings' backwards, innermost first.
    split.enter_backward(dx2, dx1);
    tp.enter_backward(dx, region(tp, g.dx_full, dx));
  }

 private:
  // y2 [N, C] += (sigmoid(x2 . gate) x) shared(x2).
  void shared_forward(const Tensor& y2, const Saved& s, const Tensor& x2) const {
    const int64_t N = x2.dim(0);
    NK_CHECK(s.sh_h.defined() && s.sh_h.dim(0) >= N, "MoE: shared expert without its activations");
    const Tensor h = s.sh_h.narrow0(0, N), a = s.sh_a.narrow0(0, N), out = s.sh_out.narrow0(0, N);
    shared_up.forward(h, x2, s.shared_up_adapters);
    ops::swiglu_forward(a, h);
    shared_down.forward(out, a, s.shared_down_adapters);
    if (!shared_gate.w.defined()) {
      ops::accumulate(y2, out);
      return;
    }
    const Tensor gl = s.gate_logits.narrow0(0, N), gw = s.gate_w.narrow0(0, N),
                 gy = s.gate_y.narrow0(0, N);
    shared_gate.forward(gl, x2);
    ops::moe_route(s.gate_probs.narrow0(0, N), s.gate_idx.narrow0(0, N), gw, s.gate_stats, gl,
                   /*sigmoid=*/true, /*norm_topk=*/false);
    ops::moe_combine(gy, out, s.gate_slot.narrow0(0, N), gw);
    ops::accumulate(y2, gy);
  }
  // dx2 [N, C] += the shared expert's (and gate's) input gradient; their
  // weights' gradients accumulate.
  void shared_backward(const Tensor& dx2, const Tensor& dy2, const Saved& s, const Scratch& g,
                       const Tensor& x2) const {
    const int64_t N = x2.dim(0);
    const Tensor dxr = g.dx_router.narrow0(0, N);
    Tensor dout = dy2;
    if (shared_gate.w.defined()) {
      const Tensor dw = g.gate_dw.narrow0(0, N), dl = g.gate_dlogits.narrow0(0, N);
      dout = g.sh_dout.narrow0(0, N);
      ops::moe_combine_backward(dout, dw, dy2, s.sh_out.narrow0(0, N), s.gate_slot.narrow0(0, N),
                                s.gate_w.narrow0(0, N));
      if (tp.active()) tp.comm->all_reduce(dw);  // sh_out holds this rank's partial sums
      ops::moe_route_backward(dl, dw, g.gate_balance, 0.f, s.gate_logits.narrow0(0, N),
                              s.gate_probs.narrow0(0, N), s.gate_idx.narrow0(0, N),
                              /*sigmoid=*/true, /*norm_topk=*/false);
      shared_gate.backward(dxr, dl, x2);
      if (tp.rank() == 0) ops::accumulate(dx2, dxr);  // equal on every rank: added once
    }
    const Tensor da = g.sh_da.narrow0(0, N), dh = g.sh_dh.narrow0(0, N);
    shared_down.backward(da, dout, s.sh_a.narrow0(0, N), s.shared_down_adapters);
    ops::swiglu_backward(dh, da, s.sh_h.narrow0(0, N));
    shared_up.backward(dxr, dh, x2, s.shared_up_adapters);
    ops::accumulate(dx2, dxr);
  }

  // The region's rows of scratch `full` (all N rows) under sequence
  // parallelism: the tp group's share of them, `outside`'s rows times its
  // size (all N when the experts' group is the attention's; with 1 < etp <
  // tp the etp ranks' rows, the token split's share). Else full itself.
  static Tensor region(const TensorParallel& t, const Tensor& full, const Tensor& outside) {
    if (!t.sp()) return full;
    return rows(full).narrow0(0, rows(outside).dim(0) * t.size());
  }
  // Under a TokenSplit: the router's statistics (s.stats, on the device),
  // the routed counts and the dropped pairs summed over the group.
  static void sum_routing(const TokenSplit& split, const Saved& s) {
    MoeRouting& r = *s.routing;
    split.sum(s.stats);
    std::vector<int64_t> n(r.count);
    n.push_back(r.dropped);
    split.sum(Tensor::from_blob(n.data(), Shape{int64_t(n.size())}, DType::I64));
    std::copy(n.begin(), n.end() - 1, r.count.begin());
    r.dropped = n.back();
  }
  // The counting sort: slots grouped by expert, each group in token order,
  // at most `capacity` per expert (the rest dropped: slot -1).
  void route_on_host(MoeRouting& r, const Tensor& idx, int64_t N, double cf) const {
    const int64_t k = top_k, E = n_experts;
    NK_CHECK(int64_t(r.idx.size()) >= N * k, "MoE: {} tokens for a workspace of {}", N,
             r.idx.size() / size_t(k));
    ops::copy_bytes_to_host(idx, r.idx.data());
    const int64_t cap = cf > 0 ? int64_t(std::ceil(cf * double(N * k) / double(E))) : N * k;
    std::fill(r.count.begin(), r.count.end(), 0);
    for (int64_t i = 0; i < N * k; ++i) ++r.count[size_t(r.idx[size_t(i)])];
    std::vector<int64_t>& next = r.next;
    int64_t at = 0;
    for (int64_t e = 0; e < E; ++e) {
      r.kept[size_t(e)] = std::min(r.count[size_t(e)], cap);
      next[size_t(e)] = at;
      at += r.kept[size_t(e)];
    }
    r.slots = at;
    r.dropped = N * k - at;
    std::vector<int64_t>& end = r.next_end;
    for (int64_t e = 0; e < E; ++e) end[size_t(e)] = next[size_t(e)] + r.kept[size_t(e)];
    for (int64_t i = 0; i < N * k; ++i) {
      const size_t e = size_t(r.idx[size_t(i)]);
      if (next[e] == end[e]) {
        r.slot[size_t(i)] = -1;
        continue;
      }
      const int64_t pos = next[e]++;
      r.src[size_t(pos)] = int32_t(i / k);
      r.slot[size_t(i)] = int32_t(pos);
    }
    r.rows = N;
  }
  // The grouped products: rows[j] rows of xs [sum rows, C] for expert
  // first + j, in order -> out (h, a: the SwiGLU's input and output).
  void experts_forward(const Tensor& xs, const Tensor& h, const Tensor& a, const Tensor& out,
                       const std::vector<int64_t>& rows, int64_t first, const Saved& s) const {
    const int64_t C = xs.dim(1), F2 = 2 * d_ff;
    const bool up_ad = lora_on(up_lora, s.up_adapters),
               down_ad = lora_on(down_lora, s.down_adapters);
    each_expert(rows, first, [&](int64_t e, int64_t r0, int64_t n) {
      const Tensor he = h.narrow0(r0, n), xe = xs.narrow0(r0, n);
      if (!up_q.empty())
        ops::quant_linear_forward_runs(he, xe, up_q[size_t(e)], Tensor());
      else if (!up_nf4.empty())
        ops::nf4_linear_forward(he, xe, up_nf4[size_t(e)], Tensor());
      else
        ops::linear_forward(he, xe, up.narrow0(F2 * e, F2), Tensor());
      if (up_ad && up_lora[size_t(e)].active())
        up_lora[size_t(e)].forward(he, xe, expert_acts(up_lora, s.up_adapters, r0, n));
    });
    const int64_t R = total(rows);
    if (R > 0) ops::swiglu_forward(a.narrow0(0, R), h.narrow0(0, R));
    each_expert(rows, first, [&](int64_t e, int64_t r0, int64_t n) {
      const Tensor oe = out.narrow0(r0, n), ae = a.narrow0(r0, n);
      if (!down_q.empty())
        ops::quant_linear_forward_runs(oe, ae, down_q[size_t(e)], Tensor());
      else if (!down_nf4.empty())
        ops::nf4_linear_forward(oe, ae, down_nf4[size_t(e)], Tensor());
      else
        ops::linear_forward(oe, ae, down.narrow0(C * e, C), Tensor());
      if (down_ad && down_lora[size_t(e)].active())
        down_lora[size_t(e)].forward(oe, ae, expert_acts(down_lora, s.down_adapters, r0, n));
    });
  }
  // Whether the experts' LoRA `lora` applies with activations ad (switched
  // off: the base experts alone).
  static bool lora_on(const std::vector<Lora>& lora, const AdapterActs& ad) {
    if (lora.empty()) return false;
    NK_CHECK(ad.defined(), "MoE: experts' adapters without their activations");
    return !ad.work->off;
  }
  // Expert rows [r0, r0 + n)'s slice of the experts' adapter activations.
  static AdapterActs expert_acts(const std::vector<Lora>& lora, const AdapterActs& ad, int64_t r0,
                                 int64_t n) {
    int64_t stride = 0;  // the most values one row keeps: parts x rank
    for (const Lora& l : lora) stride = std::max(stride, int64_t(l.parts.size()) * l.rank);
    return AdapterActs{ad.h.narrow0(r0 * stride, n * stride), ad.work, ad.stats};
  }
  // Its backward: dxs written from dout; the experts' weight gradients accumulate.
  void experts_backward(const Tensor& dxs, const Tensor& dh, const Tensor& da, const Tensor& dout,
                        const Tensor& xs, const Tensor& h, const Tensor& a,
                        const std::vector<int64_t>& rows, int64_t first, const Saved& s) const {
    const int64_t C = xs.dim(1), F2 = 2 * d_ff;
    each_expert(rows, first, [&](int64_t e, int64_t r0, int64_t n) {
      const Tensor dae = da.narrow0(r0, n), doe = dout.narrow0(r0, n), ae = a.narrow0(r0, n);
      if (!down_nf4.empty())  // frozen: the input's gradient alone
        ops::nf4_linear_backward_input(dae, doe, down_nf4[size_t(e)]);
      else
        ops::linear_backward(dae, ddown.defined() ? ddown.narrow0(C * e, C) : Tensor(), Tensor(),
                             doe, ae, down.narrow0(C * e, C));
      if (!down_lora.empty() && down_lora[size_t(e)].active())
        down_lora[size_t(e)].backward(dae, doe, ae, expert_acts(down_lora, s.down_adapters, r0, n));
    });
    const int64_t R = total(rows);
    if (R > 0) ops::swiglu_backward(dh.narrow0(0, R), da.narrow0(0, R), h.narrow0(0, R));
    each_expert(rows, first, [&](int64_t e, int64_t r0, int64_t n) {
      const Tensor dxe = dxs.narrow0(r0, n), dhe = dh.narrow0(r0, n), xe = xs.narrow0(r0, n);
      if (!up_nf4.empty())
        ops::nf4_linear_backward_input(dxe, dhe, up_nf4[size_t(e)]);
      else
        ops::linear_backward(dxe, dup.defined() ? dup.narrow0(F2 * e, F2) : Tensor(), Tensor(), dhe,
                             xe, up.narrow0(F2 * e, F2));
      if (!up_lora.empty() && up_lora[size_t(e)].active())
        up_lora[size_t(e)].backward(dxe, dhe, xe, expert_acts(up_lora, s.up_adapters, r0, n));
    });
  }
  // fn(expert, first row, rows) for every expert first + j with rows[j] > 0.
  template <typename Fn>
  static void each_expert(const std::vector<int64_t>& rows, int64_t first, Fn&& fn) {
    int64_t at = 0;
    for (size_t j = 0; j < rows.size(); ++j) {
      if (rows[j] > 0) fn(first + int64_t(j), at, rows[j]);
      at += rows[j];
    }
  }
  static int64_t total(const std::vector<int64_t>& rows) {
    int64_t n = 0;
    for (int64_t r : rows) n += r;
    return n;
  }
  // The index in up/down of this rank's first expert: its global index when
  // they hold all E experts, 0 when they hold only its E/ep (the split
  // layout, ParamLayout::shard_experts).
  // (NF4 experts: the runs held, one an expert.)
  int64_t first_held_expert() const {
    const bool nf4 = !up_nf4.empty();
    const int64_t held = nf4 ? int64_t(up_nf4.size()) : up.dim(0) / (2 * d_ff);
    if (held == n_experts) return ep.first_expert(n_experts);
    NK_CHECK(held == ep.local_experts(n_experts) &&
                 (nf4 ? int64_t(down_nf4.size()) == held : down.dim(0) == held * up.dim(1)),
             "MoE: up holds {} experts, neither all {} nor this rank's {}", held, n_experts,
             ep.local_experts(n_experts));
    return 0;
  }
  void check_expert_parallel(const ExpertExchange* x) const {
    NK_CHECK(x != nullptr, "MoE: expert parallel over {} ranks with buffers for one", ep.size());
    NK_CHECK(n_experts % ep.size() == 0, "MoE: {} experts over {} expert-parallel ranks", n_experts,
             ep.size());
  }
};

}  // namespace nk::nn
