// Next-token sampling: repetition, presence and frequency penalties, then
// greedy or temperature with top-k, top-p (nucleus) and min-p filtering, from
// a seeded per-sampler RNG (one sampler per sequence, so a sequence's draws do
// not depend on what else is in its batch).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/rng.h"

namespace nk {

// A token and its log-probability under the model's raw next-token
// distribution (log_softmax of the logits before penalties, temperature or
// filtering: what OpenAI reports, vLLM's "raw_logprobs").
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

// Most top alternatives a request (or eval logprobs) may ask for: OpenAI's
// limit, and raw_logprobs' insertion keeps k small.
inline constexpr int64_t kMaxTopLogprobs = 20;

// The log-probability of `token` under softmax(logits[V]), and the k most
// likely tokens (largest logit first, ties by lower id) appended to `top`
// with theirs. The log-sum-exp is shifted by the max and summed in double.
// The Generator's logprobs and eval logprobs (infer/perplexity.h), which pass
// the tokenizer's vocabulary as V: a padded model's rows past it (see
// Sampler) are not tokens, so they are neither listed nor in the softmax.
double raw_logprobs(const float* logits, int64_t V, int32_t token, int64_t k,
                    std::vector<TokenLogprob>& top);

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
  // OpenAI's penalties, in [-2, 2], 0 = off: logit[t] -= presence_penalty *
  // (count[t] > 0) + frequency_penalty * count[t], count[t] being how often t
  // occurs among the GENERATED tokens only (vLLM's rule; the prompt is not
  // counted). Applied after repetition_penalty; > 0 discourages repeats.
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
};

// nk::Error naming the option ("temperature", "top_k", ...) that is out of range.
void validate(const SamplingConfig& c);

class Sampler {
 public:
  // vocab: the tokenizer's ids [0, vocab), added and special tokens included;
  // 0: every id of the logits. A model's vocabulary is often padded past its
  // tokenizer's (Megatron pads to a multiple of 128 x tp, and so do most
  // Hugging Face checkpoints): those ids are no tokens, so their logits count
  // as -inf before everything else, as vLLM and Megatron drop them: greedy,
  // temperature, top-k, top-p, min-p and the penalties see the first vocab
  // logits only, and no padding id is ever sampled.
  explicit Sampler(const SamplingConfig& cfg, int64_t vocab = 0)
      : cfg_(cfg), rng_(cfg.seed), vocab_(vocab) {}
  // logits: V floats (host memory), not modified. prompt and generated: the
  // sequence's ids so far, split where generation began; repetition_penalty
  // looks at both, presence and frequency penalties at `generated` only.
  // Ties in greedy mode pick the lowest id. With every penalty off, neither
  // span is read. Returns an id below min(V, vocab).
  int32_t sample(const float* logits, int64_t V, std::span<const int32_t> prompt = {},
                 std::span<const int32_t> generated = {});
  const SamplingConfig& config() const { return cfg_; }
  int64_t vocab() const { return vocab_; }

 private:
  SamplingConfig cfg_;
  Rng rng_;
  int64_t vocab_ = 0;
  std::vector<float> work_;
  std::vector<uint8_t> seen_;
  std::vector<int32_t> count_;  // [V], all zero between calls
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<double> prob_;
};

}  // namespace nk
