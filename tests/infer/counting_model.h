// A GPT-2-shaped model over the byte tokenizer whose greedy continuation is
// known: after token t it predicts t + 1 (mod 257). Its blocks write nothing
// into the residual stream (output projections zero), positions are zero, and
// the untied head row of v is LayerNorm(wte[v - 1]), so the logit of t + 1 is
// |LN(wte[t])|^2 = C = 64 against O(sqrt(C)) for every other id. Byte 255 is
// followed by 256, the byte tokenizer's end of text.
#pragma once
#include <cmath>
#include <memory>
#include <vector>

#include "model/transformer.h"

namespace nk::test {

inline std::unique_ptr<Transformer> counting_model(DType dt = DType::F32) {
  ModelConfig c;
  c.arch = "gpt2";
  c.vocab_size = 257;
  c.max_seq_len = 64;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_kv_head = 2;
  c.d_model = 64;
  c.d_ff = 64;
  c.tied_embeddings = false;
  c.init_std = 1.0;
  auto m = std::make_unique<Transformer>(c, dt, 5);
  const ParamLayout& L = m->layout();
  auto set = [&](const std::string& name, const std::vector<float>& v) {
    ops::copy_from_host(ParamLayout::view(m->params(), L.find(name)), v.data());
  };
  auto get = [&](const std::string& name) {
    Tensor t = ParamLayout::view(m->params(), L.find(name));
    std::vector<float> v(size_t(t.numel()));
    ops::copy_to_host(t, v.data());
    return v;
  };
  const int64_t C = c.d_model, V = c.vocab_size;
  for (const char* z : {"wpe", "h.0.attn.proj.weight", "h.0.attn.proj.bias", "h.0.mlp.down.weight",
                        "h.0.mlp.down.bias"})
    set(z, std::vector<float>(get(z).size(), 0.f));
  std::vector<float> wte = get("wte"), head(size_t(V * C));
  for (int64_t v = 0; v < V; ++v) {
    const float* x = wte.data() + ((v + V - 1) % V) * C;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < C; ++i) mean += x[i];
    mean /= double(C);
    for (int64_t i = 0; i < C; ++i) var += (x[i] - mean) * (x[i] - mean);
    const double rstd = 1.0 / std::sqrt(var / double(C) + c.norm_eps);
    for (int64_t i = 0; i < C; ++i) head[size_t(v * C + i)] = float((x[i] - mean) * rstd);
  }
  set("lm_head.weight", head);
  m->sync_compute_params();
  return m;
}

}  // namespace nk::test
