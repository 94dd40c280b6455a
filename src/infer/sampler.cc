#include "infer/sampler.h"

#include <algorithm>
#include <cmath>

namespace nk {

int32_t Sampler::sample(const float* logits, int64_t V) {
  if (cfg_.temperature <= 0) return int32_t(std::max_element(logits, logits + V) - logits);
  cand_.resize(size_t(V));
  for (int64_t i = 0; i < V; ++i) cand_[i] = {logits[i] / float(cfg_.temperature), int32_t(i)};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t k = cand_.size();
  if (cfg_.top_k > 0 && size_t(cfg_.top_k) < k) {
    k = size_t(cfg_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + k, cand_.end(), by_logit);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax over the k best, then keep the smallest prefix with mass >= top_p.
  double mx = cand_[0].first, total = 0;
  std::vector<double> p(k);
  for (size_t i = 0; i < k; ++i) total += p[i] = std::exp(double(cand_[i].first) - mx);
  size_t keep = k;
  if (cfg_.top_p < 1.0) {
    double acc = 0;
    for (size_t i = 0; i < k; ++i) {
      acc += p[i] / total;
      if (acc >= cfg_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double mass = 0;
  for (size_t i = 0; i < keep; ++i) mass += p[i];
  double r = rng_.uniform() * mass;
  for (size_t i = 0; i < keep; ++i) {
    r -= p[i];
    if (r < 0) return cand_[i].second;
  }
  return cand_[keep - 1].second;
}

}  // namespace nk
