// AdamW over the model's flat arenas: one fused pass per parameter group
// (matrices with weight decay, then vectors without), which also refreshes the
// compute-dtype weights.
#pragma once
#include "model/transformer.h"

namespace nk {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

class AdamW {
 public:
  AdamW(Transformer& model, const AdamWConfig& cfg);
  // One update with learning rate `lr`; gradients are multiplied by grad_scale
  // first (clipping). Increments step().
  void step(double lr, float grad_scale);
  int64_t steps_done() const { return step_; }
  void set_steps_done(int64_t s) { step_ = s; }
  // Adopts saved moments (f32 [layout total], e.g. from a checkpoint) and the
  // update count that goes with them; the next step() continues exactly.
  void load_state(Tensor m, Tensor v, int64_t steps_done);
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }

 private:
  Transformer& model_;
  AdamWConfig cfg_;
  Tensor m_, v_;
  int64_t step_ = 0;
};

}  // namespace nk
