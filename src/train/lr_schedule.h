// Linear warmup, then cosine decay from lr to min_lr at `decay_steps`, flat after.
#pragma once
#include <cmath>
#include <cstdint>

namespace nk {

struct LrSchedule {
  double lr = 3e-4, min_lr = 3e-5;
  int64_t warmup_steps = 0, decay_steps = 1000;

  // step is 0-based: the rate used for the update of step `step`.
  double at(int64_t step) const {
    if (warmup_steps > 0 && step < warmup_steps)
      return lr * double(step + 1) / double(warmup_steps);
    if (step >= decay_steps) return min_lr;
    double span = double(decay_steps - warmup_steps);
    double progress = span > 0 ? double(step - warmup_steps) / span : 1.0;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
  }
};

}  // namespace nk
