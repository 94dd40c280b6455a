#include "align/reward_model.h"

#include <algorithm>

#include "core/error.h"

namespace nk {

std::vector<std::vector<float>> score_sequences(Transformer& model,
                                                const std::vector<std::vector<int32_t>>& seqs,
                                                int64_t batch) {
  const ModelConfig& c = model.config();
  if (!c.classifier())
    fail(
        "the model is a causal LM, not a reward model: scoring needs a sequence classifier "
        "(num_labels >= 1; nekton align align.method=rm trains one, and Hugging Face "
        "*ForSequenceClassification folders import as one)");
  NK_CHECK(batch > 0, "score_sequences: batch {}", batch);
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].empty()) fail("sequence {} to score is empty", i);
    if (int64_t(seqs[i].size()) > c.max_seq_len)
      fail("sequence {} to score has {} tokens, more than the model's max_seq_len = {}", i,
           seqs[i].size(), c.max_seq_len);
    for (int32_t t : seqs[i])
      if (t < 0 || t >= c.vocab_size)
        fail("sequence {} to score holds token id {} outside the model's vocabulary of {}", i, t,
             c.vocab_size);
  }
  const int64_t n = c.num_labels, S = int64_t(seqs.size());
  std::vector<std::vector<float>> out(static_cast<size_t>(S),
                                      std::vector<float>(static_cast<size_t>(n)));
  std::vector<float> scores;
  std::vector<int64_t> last;
  for (int64_t s0 = 0; s0 < S; s0 += batch) {
    // Rows padded with id 0 after their last token: causal attention keeps
    // the padding out of every scored position.
    const int64_t B = std::min(batch, S - s0);
    int64_t T = 0;
    for (int64_t b = 0; b < B; ++b) T = std::max(T, int64_t(seqs[size_t(s0 + b)].size()));
    Tensor host = Tensor::zeros({B, T}, DType::I32);
    last.assign(size_t(B), 0);
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<int32_t>& q = seqs[size_t(s0 + b)];
      std::copy(q.begin(), q.end(), host.data<int32_t>() + b * T);
      last[size_t(b)] = int64_t(q.size()) - 1;
    }
    Activations a(model, B, T, false);
    const Tensor tokens = ops::to_device(host, model.device());
    model.embed_forward(a, tokens);
    model.blocks_forward(a, 0, c.n_layer);
    scores.assign(size_t(B * n), 0.f);
    model.score_forward(a, last, scores);
    for (int64_t b = 0; b < B; ++b)
      std::copy(scores.begin() + b * n, scores.begin() + (b + 1) * n, out[size_t(s0 + b)].begin());
  }
  return out;
}

}  // namespace nk
