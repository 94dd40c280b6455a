// AdamW over parameter groups of flat arenas: one fused pass per trainable
// group (by default matrices with weight decay, then vectors without), which
// also refreshes the compute-dtype weights. Frozen groups have no state.
#pragma once
#include <vector>

#include "model/transformer.h"
#include "train/param_groups.h"

namespace nk {

// optim.*: the dtypes the optimizer keeps its state in (as NeMo/Megatron's
// precision-aware optimizer). The update is computed in f32 whatever they are.
struct OptimPrecision {
  // f32: the f32 master arena. bf16 (bf16 compute only): the bf16 compute
  // weights are the master, with a 16-bit remainder holding the bits rounding
  // dropped (`compensation`), so master + remainder is the f32 master exactly
  // and the f32 arena is freed; without compensation every update is rounded
  // to bf16 (drifts: BENCHMARKS.md).
  DType master = DType::F32;
  bool compensation = true;
  DType moments = DType::F32;  // f32, bf16, or f16 with per-tensor scales
  // The gradient arena: f32, or bf16 (Transformer::set_grad_dtype; the step
  // widens it chunk by chunk, kGradChunk elements at a time).
  DType grads = DType::F32;
  bool reduced() const { return master != DType::F32 || moments != DType::F32; }
};

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  OptimPrecision precision;
};

class AdamW {
 public:
  // bf16 gradients are widened to f32 this many at a time (a scratch of its size).
  static constexpr int64_t kGradChunk = 1 << 18;
  // Updates the owned shard of every trainable group of `arenas`, in list
  // order. cfg.weight_decay is not used here: each group has its own.
  // InternalError (groups come from code) for a group outside the arenas,
  // overlapping another, or whose shard lies outside it.
  AdamW(ParamArenas arenas, std::vector<ParamGroup> groups, const AdamWConfig& cfg);
  // default_param_groups(model.layout(), cfg.weight_decay, model.params().numel()) over the
  // model's arenas.
  AdamW(Transformer& model, const AdamWConfig& cfg);
  // One update: group g uses learning rate lr * g.lr_scale; gradients are
  // multiplied by grad_scale first (clipping). Increments steps_done().
  void step(double lr, float grad_scale);
  int64_t steps_done() const { return step_; }
  void set_steps_done(int64_t s) { step_ = s; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // Elements of m and v: the owned shards of the trainable groups, in list order.
  int64_t state_size() const { return m_.numel(); }
  // Bytes the optimizer's own state takes: moments, f16 scales, a bf16
  // master's remainder and bf16 gradients' f32 scratch (the weights and the
  // f32 master arena are the model's).
  int64_t state_bytes() const;
  const OptimPrecision& precision() const { return cfg_.precision; }
  // optim.master_dtype=bf16: the master lives in the compute arena (plus the
  // remainder); the caller frees the f32 arena (Transformer::release_masters).
  bool master_in_compute() const { return cfg_.precision.master == DType::BF16; }
  // The masters in f32 [params arena]: the f32 arena itself, or, with a bf16
  // master, the compute weights joined with their remainder (the exact f32
  // master; a plain bf16 master or a group without state widened).
  Tensor masters_f32() const;
  // True when m and v are laid out like the first state_size() elements of
  // the arenas (each trainable group owned whole, in arena order from 0), so
  // the layout's views apply to them: the one-process case.
  bool state_mirrors_arenas() const;
  // Adopts saved moments (f32 [state_size()], e.g. from a checkpoint) and the
  // update count that goes with them; the next step() continues exactly
  // (converted into optim.moment_dtype, so exactly only with f32 moments).
  void load_state(const Tensor& m, const Tensor& v, int64_t steps_done);
  // Adopts this process's shards of moments laid out like the whole gradient
  // arena (f32 [grads arena], as a checkpoint of any layout is read back):
  // each trainable group's [shard_begin, shard_end) is copied, rounded into
  // optim.moment_dtype.
  void load_arena_state(const Tensor& m, const Tensor& v, int64_t steps_done);
  // Where group i's shard starts in m and v.
  int64_t state_offset(size_t i) const { return state_offset_[i]; }
  // The moments as stored: f32, bf16, or f16 (m / scale, sqrt(v) / scale).
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }
  // The moments' values in f32 [state_size()] (m_ and v_ themselves when f32).
  Tensor m_f32() const { return moment_f32(m_, 0, false); }
  Tensor v_f32() const { return moment_f32(v_, 1, true); }

 private:
  ParamArenas arenas_;
  std::vector<ParamGroup> groups_;
  std::vector<int64_t> state_offset_;  // per group: where its shard's state starts in m, v
  AdamWConfig cfg_;
  Tensor m_, v_;
  Tensor scales_;     // f16 moments: f32 [groups, 2], m's and sqrt(v)'s scale per group
  Tensor remainder_;  // compensated bf16 master: the low 16 bits, [state_size()]
  Tensor grad_f32_;   // bf16 gradients: f32 [at most kGradChunk], one chunk widened
  int64_t n_params_ = 0;
  // Writes f32 moment values into group i's stored shard (rounded; f16 picks new scales).
  void store_moments(size_t i, const Tensor& m, const Tensor& v);
  Tensor moment_f32(const Tensor& stored, int which, bool sqrt) const;
  int64_t step_ = 0;
};

}  // namespace nk
