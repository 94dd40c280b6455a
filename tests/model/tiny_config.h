// The tiny GPT-2 / Llama shape the model, inference and packing tests share:
// 2 layers, 4 heads (2 kv heads for Llama: grouped-query), width 32, an
// untied head for Llama, and a larger init so attention is far from uniform.
#pragma once
#include "model/model_config.h"

namespace nk::test {

inline ModelConfig tiny_config(bool llama, int64_t vocab_size, int64_t max_seq_len) {
  ModelConfig c;
  c.arch = llama ? "llama" : "gpt2";
  c.vocab_size = vocab_size;
  c.max_seq_len = max_seq_len;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = llama ? 2 : 4;
  c.d_model = 32;
  c.d_ff = llama ? 48 : 128;
  c.tied_embeddings = !llama;
  c.init_std = 0.2;
  return c;
}

// tiny_config with 3 layers (vocabulary 61, 16 positions), optionally LoRA
// rank 4 on every linear layer: the gradient tests' model.
inline ModelConfig three_layer_config(bool llama, bool lora, double lora_dropout = 0) {
  ModelConfig c = tiny_config(llama, 61, 16);
  c.n_layer = 3;
  if (lora) {
    c.lora.rank = 4;
    c.lora.alpha = 8;
    c.lora.dropout = lora_dropout;
    c.lora.target_modules = {"all-linear"};
  }
  return c;
}

}  // namespace nk::test
