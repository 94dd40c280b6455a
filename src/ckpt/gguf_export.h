// A saved model folder (ckpt/model_io.h) as one GGUF file that llama.cpp
// loads: the architecture's GGUF name and hyper-parameters (`<arch>.*`, from
// Architecture::gguf_arch), the tokenizer stored with the model
// (ckpt/gguf_vocab.h) and the weights under llama.cpp's tensor names, which
// each architecture maps (Architecture::gguf_tensors). For the Llama family
// (Llama, Qwen2, Mistral):
//   wte                -> token_embd.weight          [V, C]
//   h.N.ln1.weight     -> blk.N.attn_norm.weight     [C]      (always f32)
//   h.N.attn.qkv       -> blk.N.attn_{q,k,v}.weight  q, k rows permuted (rope_heads)
//   h.N.attn.proj      -> blk.N.attn_output.weight
//   h.N.ln2.weight     -> blk.N.ffn_norm.weight      [C]      (always f32)
//   h.N.mlp.up         -> blk.N.ffn_{gate,up}.weight rows [gate | up] split
//   h.N.mlp.down       -> blk.N.ffn_down.weight
//   ln_f.weight        -> output_norm.weight         [C]      (always f32)
//   lm_head.weight     -> output.weight              (absent when tied)
// A model llama.cpp would run differently (a sliding window shorter than the
// context) is refused rather than written.
#pragma once
#include <cstdint>
#include <string>

#include "ckpt/gguf_writer.h"

namespace nk {

struct GgufExportOptions {
  GgmlType type = GgmlType::F16;  // matrices; 1-D norm weights stay f32
  std::string name;               // general.name; "" = the model folder's name
  bool tokenizer = true;          // false: no tokenizer.ggml.* metadata
  bool allow_nonfinite = false;   // export weights holding NaN or Inf (with a warning)
};

struct GgufExportResult {
  int64_t tensors = 0;
  std::string tokenizer;  // "llama", "gpt2" or "" (none)
};

// Writes OUT atomically. nk::Error (and OUT untouched) for a model that is
// not Llama-family, an unreadable model (naming the file), a model without a
// stored tokenizer when opt.tokenizer, a tokenizer without a GGUF form, or a
// q8_0 export of a tensor whose rows are not a multiple of 32 (naming it).
GgufExportResult export_gguf(const std::string& model_dir, const std::string& out_path,
                             const GgufExportOptions& opt);

// Nekton's rotary embedding rotates the two halves of each head (Hugging
// Face's rotate-half); llama.cpp's "llama" rope rotates adjacent pairs (Meta's
// layout). Reorders the rows of a [n_heads * head_dim, in] q or k weight so
// that, per head, new row 2j + s is old row s * head_dim / 2 + j
// (reshape(n_heads, 2, head_dim / 2, in).swapaxes(1, 2)).
void permute_rope_rows(const float* src, float* dst, int64_t n_heads, int64_t head_dim, int64_t in);

}  // namespace nk
