// Next-token sampling: repetition penalty, then greedy or temperature with
// top-k, top-p (nucleus) and min-p filtering, from a seeded per-sampler RNG
// (one sampler per sequence, so a sequence's draws do not depend on what else
// is in its batch).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/rng.h"

namespace nk {

struct SamplingConfig {
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
  uint64_t seed = 0;
  // Keep tokens whose probability is at least min_p times the most likely
  // token's (after temperature); 0 = off.
  double min_p = 0.0;
  // CTRL / Hugging Face rule over every distinct id of the context (prompt and
  // generated): a positive logit is divided by the penalty, a negative one
  // multiplied. 1 = off; > 1 discourages repeats.
  double repetition_penalty = 1.0;
};

// nk::Error naming the option ("temperature", "top_k", ...) that is out of range.
void validate(const SamplingConfig& c);

class Sampler {
 public:
  explicit Sampler(const SamplingConfig& cfg) : cfg_(cfg), rng_(cfg.seed) {}
  // logits: V floats (host memory), not modified. context: the ids the
  // repetition penalty looks at. Ties in greedy mode pick the lowest id.
  int32_t sample(const float* logits, int64_t V, std::span<const int32_t> context = {});
  const SamplingConfig& config() const { return cfg_; }

 private:
  SamplingConfig cfg_;
  Rng rng_;
  std::vector<float> work_;
  std::vector<uint8_t> seen_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<double> prob_;
};

}  // namespace nk
