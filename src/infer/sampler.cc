#include "infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"

namespace nk {

void validate(const SamplingConfig& c) {
  if (!(c.temperature >= 0)) fail("temperature: must be >= 0, got {}", c.temperature);
  if (c.top_k < 0) fail("top_k: must be >= 0, got {}", c.top_k);
  if (!(c.top_p > 0 && c.top_p <= 1)) fail("top_p: must be in (0, 1], got {}", c.top_p);
  if (!(c.min_p >= 0 && c.min_p <= 1)) fail("min_p: must be in [0, 1], got {}", c.min_p);
  if (!(c.repetition_penalty > 0))
    fail("repetition_penalty: must be > 0, got {}", c.repetition_penalty);
  if (!(c.presence_penalty >= -2 && c.presence_penalty <= 2))
    fail("presence_penalty: must be in [-2, 2], got {}", c.presence_penalty);
  if (!(c.frequency_penalty >= -2 && c.frequency_penalty <= 2))
    fail("frequency_penalty: must be in [-2, 2], got {}", c.frequency_penalty);
}

int32_t Sampler::sample(const float* logits, int64_t row, std::span<const int32_t> prompt,
                        std::span<const int32_t> generated) {
  // The padding ids past the tokenizer's vocabulary are masked by leaving
  // them out: everything below sees V = the real ids only.
  const int64_t V = vocab_ > 0 ? std::min(row, vocab_) : row;
  NK_CHECK(V > 0, "Sampler: {} logits for a vocabulary of {}", row, vocab_);
  // A NaN or +Inf logit means the model overflowed (weights or an adapter's
  // scaling): an error, never a token drawn from garbage (-Inf is a mask).
  for (int64_t i = 0; i < V; ++i)
    if (std::isnan(logits[i]) || logits[i] == INFINITY)
      fail(
          "the model's logits are not finite (id {} has {}): its weights or adapters overflow; "
          "nothing was sampled",
          i, logits[i]);
  const bool repeat = cfg_.repetition_penalty != 1.0 && (!prompt.empty() || !generated.empty());
  const bool counts =
      (cfg_.presence_penalty != 0 || cfg_.frequency_penalty != 0) && !generated.empty();
  // With every penalty off the caller's logits are used as they are, so
  // greedy picks and the RNG's draws are what they were before penalties.
  if (repeat || counts) work_.assign(logits, logits + V);
  if (repeat) {
    seen_.assign(size_t(V), 0);
    const float pen = float(cfg_.repetition_penalty);
    for (std::span<const int32_t> ids : {prompt, generated})
      for (int32_t id : ids) {
        if (id < 0 || id >= V || seen_[size_t(id)]) continue;
        seen_[size_t(id)] = 1;
        float& x = work_[size_t(id)];
        x = x > 0 ? x / pen : x * pen;
      }
  }
  if (counts) {
    // Count, then penalise each distinct id once and zero its count again, so
    // count_ needs no clearing (O(generated), not O(V), per call).
    count_.resize(size_t(V));
    for (int32_t id : generated)
      if (id >= 0 && id < V) ++count_[size_t(id)];
    for (int32_t id : generated) {
      if (id < 0 || id >= V || count_[size_t(id)] == 0) continue;
      const int32_t n = std::exchange(count_[size_t(id)], 0);
      float& x = work_[size_t(id)];
      x = float(double(x) - (cfg_.presence_penalty + cfg_.frequency_penalty * n));
    }
  }
  if (repeat || counts) logits = work_.data();
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
  // Softmax over the k best, then keep the smallest prefix with mass >= top_p,
  // then drop what is below min_p times the best (a ratio, so the order of the
  // two filters does not matter for min-p itself).
  const double mx = cand_[0].first;
  double total = 0;
  prob_.resize(k);
  for (size_t i = 0; i < k; ++i) total += prob_[i] = std::exp(double(cand_[i].first) - mx);
  size_t keep = k;
  if (cfg_.top_p < 1.0) {
    double acc = 0;
    for (size_t i = 0; i < k; ++i) {
      acc += prob_[i] / total;
      if (acc >= cfg_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (cfg_.min_p > 0) {
    // prob_[0] = exp(0) = 1 is the best token's unnormalised probability.
    size_t n = 1;
    while (n < keep && prob_[n] >= cfg_.min_p) ++n;
    keep = n;
  }
  double mass = 0;
  for (size_t i = 0; i < keep; ++i) mass += prob_[i];
  double r = rng_.uniform() * mass;
  for (size_t i = 0; i < keep; ++i) {
    r -= prob_[i];
    if (r < 0) return cand_[i].second;
  }
  return cand_[keep - 1].second;
}

double raw_logprobs(const float* l, int64_t V, int32_t token, int64_t k,
                    std::vector<TokenLogprob>& top) {
  const double mx = *std::max_element(l, l + V);
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(l[i]) - mx);
  const double lse = mx + std::log(sum);
  // Insertion into the sorted list top[first:], at most k long: one compare
  // per token for all but the few that enter it.
  const size_t first = top.size(), cap = size_t(std::max<int64_t>(k, 0));
  for (int64_t i = 0; i < V && cap > 0; ++i) {
    const bool full = top.size() - first == cap;
    if (full && !(l[i] > l[top.back().token])) continue;
    if (!full) top.emplace_back();
    size_t j = top.size() - 1;
    for (; j > first && l[i] > l[top[j - 1].token]; --j) top[j] = top[j - 1];
    top[j].token = int32_t(i);
  }
  for (size_t j = first; j < top.size(); ++j) top[j].logprob = float(double(l[top[j].token]) - lse);
  return double(l[token]) - lse;
}

}  // namespace nk
