// Key/value cache for incremental decoding, plus the workspace of one
// Transformer::forward_cached call, allocated once.
//
// Layout per layer: k, v C[NB, Hkv, B, D] in the cache's dtype C (the compute
// dtype, or a narrower one: kv_cache_dtype, bf16 or f16 halve an f32
// model's cache, q8_0 keeps each row as u8 Q8_0 blocks, [NB, Hkv, B,
// D / 32 * 34], CPU only; values are rounded once when stored): a pool of NB
// blocks of B positions. A sequence's positions live in the blocks its row of
// the step's block table names (position p in block table[p / B], offset
// p % B; see ops::attention_cached), so sequences share no padded time axis: a
// batch of prompts of different lengths is prefilled as one ragged row of
// tokens and decoded one token per live sequence, with no padding anywhere.
// The contiguous cache of S slots of L positions is one block of L per slot.
//
// Multi-head Latent Attention (DeepSeek; ModelConfig::mla): a layer's k is
// the latent cache C[NB, 1, B, kv_lora_rank + qk_rope_head_dim], one row per
// position (the normed latent and the shared rotary key), and v is the same
// tensor (nn::LatentAttention::cached_forward reads the row as both): per
// position and layer kv_lora_rank + qk_rope_head_dim values instead of
// 2 n_head head_dim.
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/model_config.h"
#include "nn/adapters.h"
#include "nn/attention.h"
#include "nn/moe.h"
#include "nn/prompt.h"

namespace nk {

// The pool and workspace sizes of a KVCache.
struct KVCacheShape {
  int64_t blocks = 0;      // NB
  int64_t block_size = 0;  // B: positions per block
  int64_t max_len = 0;     // positions per sequence (<= the model's max_seq_len)
  int64_t max_seqs = 0;    // block-table rows one forward_cached call may name
  int64_t max_tokens = 0;  // new tokens one call may carry (prefill chunks + decode tokens)
  // Tensor-parallel ranks the model is split over: this rank's cache and
  // workspace hold its 1/tp of the heads and MLP units (and of the padded
  // vocabulary's logits, gathered whole in logits_all).
  int64_t tp = 1;
  // The ranks a Mixture-of-Experts layer's experts are split over
  // (parallel.etp, nn::TensorParallel::expert_size(): 1 when whole on every
  // rank; 0: tp): this rank's workspace holds its 1/etp of their units.
  int64_t etp = 0;
  int64_t expert_ranks() const { return etp > 0 ? etp : tp; }
  // Block-table entries per sequence: ceil(max_len / block_size).
  int64_t table_width() const { return (max_len + block_size - 1) / block_size; }
};

// The dtype k and v are kept in: nullopt (a kv_cache_dtype of "auto") is the
// compute dtype's.
using KvDType = std::optional<DType>;

// The value of a kv_cache_dtype key (generate.kv_cache_dtype,
// serve.kv_cache_dtype): "auto" (nullopt), "f32", "bf16" or "f16" (their
// long names too), or "q8_0" (DType::U8: rows of ggml's Q8_0 blocks, see
// ops::kv_cache_store; CPU only). nk::Error naming `key` otherwise.
KvDType parse_kv_cache_dtype(const std::string& value, const std::string& key);
// "auto", "f32", "bf16", "f16", "q8_0": the one-line doc of such keys.
extern const char* const kKvCacheDtypeDoc;
// A cache dtype's name as the keys spell it ("q8_0" for U8).
const char* kv_cache_dtype_name(DType kv);
// nk::Error naming `key` unless model c's cache can be kept in kv on device:
// a q8_0 cache needs the CPU and rows (head_dim, or an MLA latent row) of a
// multiple of 32 values.
void check_kv_cache_dtype(const ModelConfig& c, KvDType kv, Device device, const std::string& key);

class KVCache {
 public:
  // device: the model's. kv: the dtype of k and v (nullopt: compute's).
  KVCache(const ModelConfig& cfg, DType compute, const KVCacheShape& shape, Device device = kHost,
          KvDType kv = std::nullopt);
  // The contiguous cache: `slots` sequences of max_len positions each, one
  // block per slot (block table row s = [s]).
  KVCache(const ModelConfig& cfg, DType compute, int64_t slots, int64_t max_len, int64_t max_tokens,
          Device device = kHost, KvDType kv = std::nullopt, int64_t tp = 1, int64_t etp = 0);

  const KVCacheShape& shape() const { return shape_; }
  int64_t blocks() const { return shape_.blocks; }
  int64_t block_size() const { return shape_.block_size; }
  int64_t max_len() const { return shape_.max_len; }
  int64_t max_tokens() const { return shape_.max_tokens; }
  DType dtype() const { return dtype_; }        // the workspace's: the compute dtype
  DType kv_dtype() const { return kv_dtype_; }  // k's and v's
  // Whether layers keep MLA's latent rows (k and v one tensor).
  bool latent() const { return latent_; }
  // Bytes of the cache proper (k and v of every layer; a latent cache's once).
  int64_t cache_bytes() const;
  // For logs: "KV cache bf16 (compute f32): 2048 bytes/token, 64.00 MiB for 32768 positions";
  // a latent cache's adds what per-head keys and values would take.
  std::string describe() const;
  // Bytes one block takes over all layers (k and v, or the latent rows) in dtype kv.
  // (tp: a tensor-parallel rank's, its 1/tp of the heads; a latent cache's
  // rows are every rank's whole.)
  static int64_t block_bytes(const ModelConfig& cfg, DType kv, int64_t block_size, int64_t tp = 1);
  // Bytes one position takes over all layers (k and v) in dtype kv.
  static int64_t token_bytes(const ModelConfig& cfg, DType kv) { return block_bytes(cfg, kv, 1); }
  // Bytes one position would take as every kv head's key and value (what an
  // MLA model's cache held before it kept the latent; token_bytes otherwise).
  static int64_t head_token_bytes(const ModelConfig& cfg, DType kv);

 private:
  friend class Transformer;
  KVCacheShape shape_;
  DType dtype_, kv_dtype_;
  bool latent_ = false;
  int64_t head_token_bytes_ = 0;  // for describe()
  std::vector<Tensor> k, v;  // per layer [NB, Hkv, B, D] in kv_dtype_ (MLA: k = v [NB, 1, B, L])
  // Workspace, rows = max_tokens.
  Tensor tokens, seq_ids, positions;  // i32 [max_tokens]
  Tensor table;                       // i32 [max_seqs, table_width]
  Tensor x, ln, qkv, att, tmp, h, a;  // [rows, C], [rows, C], [rows, W], ... (h, a: dense MLP)
  nn::MoE::Saved moe;                 // a MoE model's feed-forward workspace, rows = max_tokens
  nn::SelfAttention::QkActs qk;       // with q/k norms (Qwen3), rows = max_tokens
  nn::LatentAttention::Acts mla;      // with MLA (DeepSeek), rows = max_tokens
  nn::LatentAttention::CacheActs mla_cache;
  // A block-quantised MLA model's kv_b weights, dequantised per layer by the
  // first forward_cached (the decode reads them by head); empty otherwise.
  std::vector<Tensor> mla_kv_b;
  Tensor mean, rstd;   // f32 [rows]
  Tensor sel;          // [head_rows, C] gathered rows for the head
  Tensor head_logits;  // [head_rows, V] compute dtype (tensor parallel: this rank's V / tp)
  // Tensor parallel: f32 [head_rows * V / tp], this rank's logits (then
  // scratch), and [tp * head_rows * V / tp], every rank's gathered.
  Tensor head_f32, logits_all;
  int64_t head_rows = 0;
  // The adapters' scratch when the model has any, and what an adapted layer
  // keeps between its products (every layer reuses it): LoRA's x A^T of every
  // part, a bottleneck's input and hidden (lora_h) and norm statistics.
  std::unique_ptr<nn::AdapterScratch> adapters;
  Tensor lora_h, adapter_stats;
  nn::Prompt::Saved prompt;  // p-tuning's encoder activations, when it has an encoder
};

// One forward_cached call's new tokens (host memory). Token n is tokens[n] at
// positions[n] of the sequence whose blocks are row seqs[n] of block_table
// ([Q, table_width] row-major, Q <= max_seqs; entries past a sequence's
// length are not read); logit_rows lists the n whose logits are wanted, in
// the order of the output rows.
struct CachedStep {
  std::span<const int32_t> tokens, seqs, positions;
  std::span<const int32_t> logit_rows;
  std::span<const int32_t> block_table;
};

}  // namespace nk
