// AdamW over parameter groups of flat arenas: one fused pass per trainable
// group (by default matrices with weight decay, then vectors without), which
// also refreshes the compute-dtype weights. Frozen groups have no state.
#pragma once
#include <vector>

#include "model/transformer.h"
#include "train/param_groups.h"

namespace nk {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

class AdamW {
 public:
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
  // True when m and v are laid out like the first state_size() elements of
  // the arenas (each trainable group owned whole, in arena order from 0), so
  // the layout's views apply to them: the one-process case.
  bool state_mirrors_arenas() const;
  // Adopts saved moments (f32 [state_size()], e.g. from a checkpoint) and the
  // update count that goes with them; the next step() continues exactly.
  void load_state(Tensor m, Tensor v, int64_t steps_done);
  // Adopts this process's shards of moments laid out like the whole gradient
  // arena (f32 [grads arena], as a checkpoint of any layout is read back):
  // each trainable group's [shard_begin, shard_end) is copied.
  void load_arena_state(const Tensor& m, const Tensor& v, int64_t steps_done);
  // Where group i's shard starts in m and v.
  int64_t state_offset(size_t i) const { return state_offset_[i]; }
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }

 private:
  ParamArenas arenas_;
  std::vector<ParamGroup> groups_;
  std::vector<int64_t> state_offset_;  // per group: where its shard's state starts in m, v
  AdamWConfig cfg_;
  Tensor m_, v_;
  int64_t step_ = 0;
};

}  // namespace nk
