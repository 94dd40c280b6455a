// Next-token sampling: greedy, temperature, top-k, top-p (nucleus), seeded.
#pragma once
#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace nk {

struct SamplingConfig {
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingConfig& cfg) : cfg_(cfg), rng_(cfg.seed) {}
  // logits: V floats (host memory). Ties in greedy mode pick the lowest id.
  int32_t sample(const float* logits, int64_t V);

 private:
  SamplingConfig cfg_;
  Rng rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

}  // namespace nk
