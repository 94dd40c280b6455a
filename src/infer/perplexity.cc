#include "infer/perplexity.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "ops/ops.h"

namespace nk {

namespace {

// Window k feeds x[b, b+n) with b = k*S, n = min(W, L-1-b), after the V
// virtual tokens (p-tuning: placeholders the model replaces, which take
// positions and predict nothing), and scores the targets x[b+1, b+n+1) from
// index `done` on (the ones no earlier window scored).
struct Windows {
  int64_t V = 0, W = 0, S = 0, L = 0, total = 0;

  Windows(const Transformer& model, const std::vector<int32_t>& tokens,
          const PerplexityOptions& opt) {
    const ModelConfig& c = model.config();
    V = c.prompt.virtual_tokens;
    const int64_t room = c.max_seq_len - V;
    W = opt.window ? opt.window : room;
    S = opt.stride == -1 ? W : opt.stride;
    if (W < 1 || W > room)
      fail("eval.window: {} must be in [1, model.max_seq_len = {}{}]", W, c.max_seq_len,
           V ? fmt::format(" - {} virtual tokens", V) : "");
    if (S < 1 || S > W) fail("eval.stride: {} must be in [1, eval.window = {}]", S, W);
    L = int64_t(tokens.size());
    if (L < 2) fail("eval: {} token(s) to score; perplexity needs at least 2", L);
    for (int64_t i = 0; i < L; ++i)
      if (tokens[size_t(i)] < 0 || tokens[size_t(i)] >= c.vocab_size)
        fail("eval: token {} at position {} is outside the model's vocabulary ({})",
             tokens[size_t(i)], i, c.vocab_size);
    for (int64_t b = 0;; b += S) {
      ++total;
      if (b + std::min(W, L - 1 - b) >= L - 1) break;
    }
  }

  // fn(acts, x [1, V + n] on the model's device, b, n, done) per window, in order.
  template <class Fn>
  void each(Transformer& model, const std::vector<int32_t>& tokens, Fn&& fn,
            const std::function<void(int64_t, int64_t)>& on_window) const {
    std::unique_ptr<Activations> full, last;
    const Device dev = model.device();
    std::vector<int32_t> inp(size_t(V + W), 0);
    int64_t done = 1;
    for (int64_t k = 0, b = 0; k < total; ++k, b += S) {
      const int64_t n = std::min(W, L - 1 - b);
      std::unique_ptr<Activations>& acts = n == W ? full : last;
      if (!acts || acts->T != V + n) acts = std::make_unique<Activations>(model, 1, V + n, false);
      Tensor x = Tensor::empty({1, V + n}, DType::I32, dev);
      for (int64_t i = 0; i < n; ++i) inp[size_t(V + i)] = tokens[size_t(b + i)];
      ops::copy_bytes_from_host(x, inp.data());
      fn(*acts, x, b, n, done);
      done = b + n + 1;
      if (on_window) on_window(k + 1, total);
    }
  }
};

}  // namespace

PerplexityResult evaluate_perplexity(Transformer& model, const std::vector<int32_t>& tokens,
                                     const PerplexityOptions& opt,
                                     const std::function<void(int64_t, int64_t)>& on_window) {
  const Windows w(model, tokens, opt);
  std::vector<int32_t> tgt(size_t(w.V + w.W), int32_t(Transformer::kIgnoreIndex));
  PerplexityResult res;
  double sum = 0;
  w.each(
      model, tokens,
      [&](Activations& acts, const Tensor& x, int64_t b, int64_t n, int64_t done) {
        Tensor y = Tensor::empty({1, w.V + n}, DType::I32, model.device());
        int64_t scored = 0;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t t = b + 1 + i;  // index of the target
          tgt[size_t(w.V + i)] = t >= done ? tokens[size_t(t)] : int32_t(Transformer::kIgnoreIndex);
          scored += t >= done;
        }
        ops::copy_bytes_from_host(y, tgt.data());
        const float mean = model.forward_loss(acts, x, y);
        sum += double(mean) * double(scored);
        res.tokens_scored += scored;
      },
      on_window);
  res.windows = w.total;
  res.mean_loss = sum / double(res.tokens_scored);
  res.perplexity = std::exp(res.mean_loss);
  return res;
}

std::vector<ScoredToken> token_logprobs(Transformer& model, const std::vector<int32_t>& tokens,
                                        const PerplexityOptions& opt, int64_t top_k,
                                        const std::function<void(int64_t, int64_t)>& on_window,
                                        int64_t tokens_vocab) {
  const Windows w(model, tokens, opt);
  const int64_t vocab = model.config().vocab_size;
  NK_CHECK(tokens_vocab >= 0 && tokens_vocab <= vocab,
           "token_logprobs: a vocabulary of {} ids for a model of {} rows", tokens_vocab, vocab);
  const int64_t real = tokens_vocab > 0 ? tokens_vocab : vocab;  // the ids scored and listed
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= real)
      fail("eval: token {} at position {} is outside the tokenizer's vocabulary ({})", tokens[i], i,
           real);
  if (top_k < 0 || top_k > std::min(kMaxTopLogprobs, real))
    fail("eval.top_k: {} must be in [0, {}]", top_k, std::min(kMaxTopLogprobs, real));
  std::vector<ScoredToken> out;
  std::vector<float> rows;
  w.each(
      model, tokens,
      [&](Activations& acts, const Tensor& x, int64_t b, int64_t n, int64_t done) {
        Tensor logits = Tensor::empty({w.V + n, vocab}, DType::F32, model.device());
        model.forward_all_logits(acts, x, logits);
        rows.resize(size_t((w.V + n) * vocab));
        ops::copy_bytes_to_host(logits, rows.data());
        for (int64_t i = 0; i < n; ++i) {
          const int64_t t = b + 1 + i;
          if (t < done) continue;
          ScoredToken r;
          r.position = t;
          r.id = tokens[size_t(t)];
          // Row V + i predicts x_t.
          r.logprob = raw_logprobs(rows.data() + (w.V + i) * vocab, real, r.id, top_k, r.top);
          out.push_back(std::move(r));
        }
      },
      on_window);
  return out;
}

}  // namespace nk
