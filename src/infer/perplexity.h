// Perplexity of a token stream with Hugging Face's sliding-window method.
//
// Tokens x_0..x_{L-1}; every x_t with t >= 1 is scored exactly once, as the
// prediction from the tokens before it within one window. Window k feeds the
// `window` tokens starting at k*stride (fewer at the end) and scores the
// predictions the previous windows did not make, so with stride < window each
// scored token (past the first window) sees at least window - stride tokens of
// context, and stride = window gives disjoint chunks. (Hugging Face's
// max_length counts the window's first token, which is context only: it is
// window + 1 here.) A p-tuned model (ModelConfig::prompt) reads each window
// after its virtual tokens, as it was trained.
#pragma once
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "infer/sampler.h"
#include "model/transformer.h"

namespace nk {

struct PerplexityOptions {
  int64_t window = 0;   // text tokens fed per forward (<= max_seq_len less virtual tokens); 0: all
  int64_t stride = -1;  // in [1, window]; -1 = window
};

struct PerplexityResult {
  int64_t tokens_scored = 0;
  int64_t windows = 0;
  double mean_loss = 0;   // nats per scored token
  double perplexity = 0;  // exp(mean_loss)
};

// nk::Error naming the option (eval.window, eval.stride) for a bad setting,
// and for fewer than 2 tokens. on_window (optional)
// sees (windows done, windows total).
PerplexityResult evaluate_perplexity(Transformer& model, const std::vector<int32_t>& tokens,
                                     const PerplexityOptions& opt,
                                     const std::function<void(int64_t, int64_t)>& on_window = {});

// One scored token: log p(x_t | x_<t) in nats, and the top_k most likely ids
// at that position with theirs, most likely first (ties: the lower id).
struct ScoredToken {
  int64_t position = 0;  // t
  int32_t id = 0;        // x_t
  double logprob = 0;
  std::vector<TokenLogprob> top;
};

// Every x_t with t >= 1, scored with evaluate_perplexity's windows, from the
// model's logits (log-softmax in double): the loglikelihood primitive of
// evaluation harnesses. vocab: the tokenizer's ids (0: every row of the
// model); a padded model's rows past them are no tokens (Sampler), so they
// are neither in the softmax nor among the top, as generation reports them.
// Same errors as evaluate_perplexity, and for a token outside vocab.
std::vector<ScoredToken> token_logprobs(Transformer& model, const std::vector<int32_t>& tokens,
                                        const PerplexityOptions& opt, int64_t top_k,
                                        const std::function<void(int64_t, int64_t)>& on_window = {},
                                        int64_t vocab = 0);

}  // namespace nk
