// Key/value cache for incremental decoding, plus the workspace of one
// Transformer::forward_cached call, allocated once.
//
// Layout per layer: k, v T[S, Hkv, L, D] in the compute dtype: S sequence
// slots of up to L positions. Sequences do not share a padded time axis: each
// new token names its slot and position (see ops::attention_cached), so a
// batch of prompts of different lengths is prefilled as one ragged row of
// tokens and decoded one token per live sequence, with no padding anywhere.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "model/model_config.h"
#include "nn/adapters.h"
#include "nn/prompt.h"

namespace nk {

class KVCache {
 public:
  // slots: sequences held at once; max_len: positions per sequence (<= the
  // model's max_seq_len); max_tokens: new tokens one forward_cached call may
  // carry (prefill chunk + decode tokens). device: the model's.
  KVCache(const ModelConfig& cfg, DType compute, int64_t slots, int64_t max_len, int64_t max_tokens,
          Device device = kHost);

  int64_t slots() const { return slots_; }
  int64_t max_len() const { return max_len_; }
  int64_t max_tokens() const { return max_tokens_; }
  DType dtype() const { return dtype_; }
  // Bytes of the cache proper (k and v of every layer).
  int64_t cache_bytes() const;

 private:
  friend class Transformer;
  int64_t slots_, max_len_, max_tokens_;
  DType dtype_;
  std::vector<Tensor> k, v;  // per layer [S, Hkv, L, D]
  // Workspace, rows = max_tokens.
  Tensor tokens, slot_ids, positions;  // i32 [max_tokens]
  Tensor x, ln, qkv, att, tmp, h, a;   // [rows, C], [rows, C], [rows, W], ...
  Tensor mean, rstd;                   // f32 [rows]
  Tensor sel;                          // [head_rows, C] gathered rows for the head
  Tensor head_logits;                  // [head_rows, V] compute dtype
  int64_t head_rows = 0;
  // The adapters' scratch when the model has any, and what an adapted layer
  // keeps between its products (every layer reuses it): LoRA's x A^T of every
  // part, a bottleneck's input and hidden (lora_h) and norm statistics.
  std::unique_ptr<nn::AdapterScratch> adapters;
  Tensor lora_h, adapter_stats;
  nn::Prompt::Saved prompt;  // p-tuning's encoder activations, when it has an encoder
};

// One forward_cached call's new tokens (host memory). Token n is tokens[n] at
// positions[n] of cache slot slots[n]; logit_rows lists the n whose logits are
// wanted, in the order of the output rows.
struct CachedStep {
  std::span<const int32_t> tokens, slots, positions;
  std::span<const int32_t> logit_rows;
};

}  // namespace nk
