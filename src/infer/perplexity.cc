#include "infer/perplexity.h"

#include <cmath>
#include <memory>

#include "ops/ops.h"

namespace nk {

PerplexityResult evaluate_perplexity(Transformer& model, const std::vector<int32_t>& tokens,
                                     const PerplexityOptions& opt,
                                     const std::function<void(int64_t, int64_t)>& on_window) {
  const ModelConfig& c = model.config();
  // p-tuning: each window is fed after the virtual tokens (placeholders the
  // model replaces), which take positions and predict nothing.
  const int64_t V = c.prompt.virtual_tokens, room = c.max_seq_len - V;
  const int64_t W = opt.window ? opt.window : room;
  const int64_t S = opt.stride == -1 ? W : opt.stride;
  if (W < 1 || W > room)
    fail("eval.window: {} must be in [1, model.max_seq_len = {}{}]", W, c.max_seq_len,
         V ? fmt::format(" - {} virtual tokens", V) : "");
  if (S < 1 || S > W) fail("eval.stride: {} must be in [1, eval.window = {}]", S, W);
  const int64_t L = int64_t(tokens.size());
  if (L < 2) fail("eval: {} token(s) to score; perplexity needs at least 2", L);
  for (int64_t i = 0; i < L; ++i)
    if (tokens[size_t(i)] < 0 || tokens[size_t(i)] >= c.vocab_size)
      fail("eval: token {} at position {} is outside the model's vocabulary ({})",
           tokens[size_t(i)], i, c.vocab_size);
  // Window k feeds x[b, b+n) with b = k*S, n = min(W, L-1-b), and scores the
  // targets x[b+1, b+n+1) from index `done` on (the ones not scored yet).
  int64_t total = 0;
  for (int64_t b = 0;; b += S) {
    ++total;
    if (b + std::min(W, L - 1 - b) >= L - 1) break;
  }
  std::unique_ptr<Activations> full, last;
  const Device dev = model.device();
  Tensor in = Tensor::empty({1, V + W}, DType::I32, dev),
         tg = Tensor::empty({1, V + W}, DType::I32, dev);
  std::vector<int32_t> inp(size_t(V + W), 0),
      tgt(size_t(V + W), int32_t(Transformer::kIgnoreIndex));
  PerplexityResult res;
  double sum = 0;
  int64_t done = 1;
  for (int64_t k = 0, b = 0; k < total; ++k, b += S) {
    const int64_t n = std::min(W, L - 1 - b);
    std::unique_ptr<Activations>& acts = n == W ? full : last;
    if (!acts || acts->T != V + n) acts = std::make_unique<Activations>(model, 1, V + n, false);
    Tensor x = n == W ? in : Tensor::empty({1, V + n}, DType::I32, dev);
    Tensor y = n == W ? tg : Tensor::empty({1, V + n}, DType::I32, dev);
    int64_t scored = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = b + 1 + i;  // index of the target
      inp[size_t(V + i)] = tokens[size_t(b + i)];
      tgt[size_t(V + i)] = t >= done ? tokens[size_t(t)] : int32_t(Transformer::kIgnoreIndex);
      scored += t >= done;
    }
    ops::copy_bytes_from_host(x, inp.data());
    ops::copy_bytes_from_host(y, tgt.data());
    const float mean = model.forward_loss(*acts, x, y);
    sum += double(mean) * double(scored);
    res.tokens_scored += scored;
    done = b + n + 1;
    if (on_window) on_window(k + 1, total);
  }
  res.windows = total;
  res.mean_loss = sum / double(res.tokens_scored);
  res.perplexity = std::exp(res.mean_loss);
  return res;
}

}  // namespace nk
