// A saved model folder (ckpt/model_io.h) as one GGUF file that llama.cpp
// loads: the architecture's GGUF name and hyper-parameters (`<arch>.*`, from
// Architecture::gguf_arch; rotary keys only for rotary positions, the norm
// epsilon under the key of the block's norm), a tokenizer (ckpt/gguf_vocab.h:
// the one stored with the model, or any load_tokenizer() spec given instead)
// with the chat template of the folder's tokenizer_config.json
// (tokenizer.chat_template) when it has one, and the weights under llama.cpp's
// tensor names, which each architecture maps (Architecture::gguf_tensors;
// the experts of Mixtral, Qwen2-MoE and Qwen3-MoE as llama.cpp's stacked
// 3-d tensors, arch.h moe_gguf_tensors, with <arch>.expert_count,
// expert_used_count and, for qwen2moe/qwen3moe, expert_feed_forward_length
// and expert_shared_feed_forward_length; a head size apart from
// d_model / n_head as attention.key_length and value_length). For
// the Llama family (Llama, Qwen2, Mistral):
//   wte                -> token_embd.weight          [V, C]
//   h.N.ln1.weight     -> blk.N.attn_norm.weight     [C]      (always f32)
//   h.N.attn.qkv       -> blk.N.attn_{q,k,v}.weight  q, k rows permuted (rope_heads)
//   h.N.attn.proj      -> blk.N.attn_output.weight
//   h.N.ln2.weight     -> blk.N.ffn_norm.weight      [C]      (always f32)
//   h.N.mlp.up         -> blk.N.ffn_{gate,up}.weight rows [gate | up] split
//   h.N.mlp.down       -> blk.N.ffn_down.weight
//   ln_f.weight        -> output_norm.weight         [C]      (always f32)
//   lm_head.weight     -> output.weight              (absent when tied)
// For GPT-2 (llama.cpp's "gpt2"): wpe -> position_embd.weight [T, C], the
// fused QKV whole as blk.N.attn_qkv.{weight,bias} (rows [q; k; v]), the
// MLP as blk.N.ffn_{up,down}, and every norm and projection with its bias
// (`.bias` beside `.weight`).
// Gemma 2 and 3 (llama.cpp's gemma2, gemma3): Llama's names with the
// post-norms blk.N.post_attention_norm and post_ffw_norm, every norm stored
// as 1 + w, and attention.sliding_window, attn_logit_softcapping,
// final_logit_softcapping (gguf_export.cc add_gemma lists what llama.cpp
// fixes and export checks).
// DeepSeek-V2/V3 (llama.cpp's deepseek2): kv_b split per head as its
// converter writes it for the absorbed path, attn_k_b [H, kv_rank, nope]
// (each head's nope rows transposed) and attn_v_b [H, v, kv_rank], with
// key_length_mla / value_length_mla (gguf_export.cc add_latent_attention).
// A model llama.cpp would run differently (a sliding window shorter than the
// context outside Gemma) is refused rather than written, and so is one without a tokenizer
// (llama.cpp refuses to load a GGUF that has none).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/gguf_writer.h"

namespace nk {

// The types of a file's matrices (`--type`): one type for all of them (f32,
// f16, bf16, q8_0, q4_0, q4_k, q6_k) or llama.cpp's mixed q4_k_m, tensor by
// tensor as llama.cpp's quantiser chooses (gguf_tensor_type).
const std::vector<std::string>& gguf_recipes();
// nk::Error listing the recipes otherwise.
void check_gguf_recipe(const std::string& recipe);
// The type of GGUF tensor `name` of `shape` under `recipe` in a model of
// n_layer layers, tied or not:
//   - 1-d tensors (norms, biases) f32;
//   - the output projection (token_embd when tied) q6_k under every 4-bit
//     recipe, as llama.cpp;
//   - q4_k_m: q6_k for attn_v and ffn_down in layers i with i < n/8,
//     i >= 7n/8 or (i - n/8) % 3 == 2 (llama.cpp's use_more_bits), q4_k
//     elsewhere;
//   - a Mixture-of-Experts router (ffn_gate_inp) f32, as llama.cpp's
//     converter and quantiser keep it; ffn_down_exps and ffn_down_shexp as ffn_down;
//   - with n_expert == 8 (Mixtral), as llama.cpp: attn_k and attn_v q8_0
//     under every block-quantised recipe, and q4_k_m's attn_output q6_k
//     (llama.cpp's q5_k, which Nekton lacks: the next type with more bits);
//   - rows not a multiple of a type's block fall back: k-quants to q8_0,
//     then q4_0 and q8_0 to f16 (llama.cpp falls back to its q5 types,
//     which Nekton lacks).
GgmlType gguf_tensor_type(const std::string& recipe, const std::string& name, const Shape& shape,
                          int64_t n_layer, bool tied, int64_t n_expert = 0);

struct GgufExportOptions {
  std::string type = "f16";  // a recipe (gguf_recipes); 1-D tensors stay f32
  std::string name;          // general.name; "" = the model folder's name
  // A load_tokenizer() spec to write instead of the model's stored tokenizer;
  // "" = the stored one.
  std::string tokenizer;
  bool allow_nonfinite = false;  // export weights holding NaN or Inf (with a warning)
  Progress* progress = nullptr;  // the tensors' bytes as they are encoded and written
};

struct GgufExportResult {
  int64_t tensors = 0;
  std::string tokenizer;  // "llama" or "gpt2"; "" for a requantised GGUF input that has none
};

// Writes OUT atomically. nk::Error (and OUT untouched) for an architecture
// without a GGUF form, an unreadable model (naming the file), no tokenizer
// (none stored and none in opt.tokenizer: the message says to pass
// --tokenizer SPEC), a tokenizer without a GGUF form or with more ids than
// the model's vocab_size (naming the spec), or a recipe that is none of
// gguf_recipes().
GgufExportResult export_gguf(const std::string& model_dir, const std::string& out_path,
                             const GgufExportOptions& opt);

// A GGUF file (any architecture) written again with `recipe`'s tensor types,
// as llama.cpp's llama-quantize does: every metadata pair copied as it is
// (general.file_type, quantization_version and alignment rewritten), each
// tensor read into f32 and encoded anew in file order. A source whose
// matrices are already block-quantised needs allow_requantize (rounding
// twice loses more than once). Writes OUT atomically; nk::Error naming the
// file and tensor for a type Nekton does not read.
GgufExportResult requantize_gguf(const std::string& in_path, const std::string& out_path,
                                 const std::string& recipe, bool allow_requantize,
                                 Progress* progress = nullptr);

// Nekton's rotary embedding rotates the two halves of each head (Hugging
// Face's rotate-half); llama.cpp's "llama" rope rotates adjacent pairs (Meta's
// layout). Reorders the rows of a [n_heads * head_dim, in] q or k weight so
// that, per head, new row 2j + s is old row s * head_dim / 2 + j
// (reshape(n_heads, 2, head_dim / 2, in).swapaxes(1, 2)).
void permute_rope_rows(const float* src, float* dst, int64_t n_heads, int64_t head_dim, int64_t in);

}  // namespace nk
