#include "infer/generate.h"

namespace nk {

std::vector<int32_t> generate(Transformer& model, const std::vector<int32_t>& prompt,
                              int64_t max_new, Sampler& sampler,
                              const std::function<bool(int32_t)>& on_token) {
  if (prompt.empty()) fail("generate: the prompt is empty");
  const ModelConfig& c = model.config();
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= c.vocab_size)
      fail("generate: prompt token {} at position {} is outside the vocabulary of {}", prompt[i], i,
           c.vocab_size);
  std::vector<int32_t> ctx = prompt, out;
  Tensor logits = Tensor::empty({1, c.vocab_size}, DType::F32);
  std::vector<float> host(size_t(c.vocab_size));
  for (int64_t n = 0; n < max_new; ++n) {
    int64_t T = std::min<int64_t>(int64_t(ctx.size()), c.max_seq_len);
    Tensor tokens = Tensor::empty({1, T}, DType::I32);
    ops::copy_bytes_from_host(tokens, ctx.data() + (int64_t(ctx.size()) - T));
    Activations acts(c, model.compute_dtype(), 1, T, false);
    model.forward_last_logits(acts, tokens, logits);
    ops::copy_to_host(logits, host.data());
    int32_t next = sampler.sample(host.data(), c.vocab_size);
    ctx.push_back(next);
    out.push_back(next);
    if (on_token && !on_token(next)) break;
  }
  return out;
}

}  // namespace nk
