// Loading a GGUF file of the Llama family (llama.cpp's "llama", "qwen2",
// "qwen3", "qwen2moe", "qwen3moe" and "dots1" architectures: Llama 1-3,
// Mistral without a sliding window, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE,
// dots.llm1; a "llama" file with llama.expert_count > 0 as Mixtral, its
// stacked ffn_*_exps tensors one piece per expert), of GPT-2 (llama.cpp's "gpt2")
// or of Gemma 2 and Gemma 3's text model ("gemma2", "gemma3": the window and
// soft-capping keys, what llama.cpp's graphs fix taken as they fix it, the
// (1 + w) norms stored as 1 + w put back to w) as a Nekton model that runs
// directly, as llama.cpp would run it:
//   - the hyper-parameters from `<arch>.*` metadata, RoPE scaling included
//     (linear, yarn, and llama3's rope_freqs.weight recognised as such; no
//     rotary keys for GPT-2's learned positions, and its epsilon under
//     layer_norm_epsilon);
//   - tensors under llama.cpp's names (the inverse of ckpt/gguf_export.h's
//     table): q and k rows put back from llama.cpp's rotary order, q/k/v and
//     gate/up fused into Nekton's parameters;
//   - F32 and BF16 tensors (and 1-d F16 ones) read into the compute dtype;
//     F16, Q8_0, Q4_0, Q4_K and Q6_K matrices kept as they are (ops/quant.h:
//     the products read them directly), their rows moved as raw bytes, so
//     nothing is requantised; a fused parameter whose parts differ in type (Q4_K_M's
//     attn_v) is held as runs of rows (model/transformer.h QuantPlan); what
//     the model cannot hold so (learned positions, and the token embedding
//     beside them) is decoded dense;
//   - the tokenizer from tokenizer.ggml.* (ckpt/gguf_tokenizer.h) and the
//     chat template from tokenizer.chat_template;
//   - under tensor parallelism (GgufLoadOptions::tp) each rank's share.
// Every file error names the file and the key or tensor.
#pragma once
#include <memory>
#include <string>

#include "ckpt/gguf_reader.h"
#include "data/tokenizer/tokenizer.h"
#include "model/transformer.h"

namespace nk {

struct GgufModel {
  std::unique_ptr<Transformer> model;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the file has no tokenizer.ggml.model
  std::string chat_template;             // tokenizer.chat_template (Jinja), "" when absent
  std::string name;                      // general.name, else the file's stem
};

struct GgufLoadOptions {
  DType compute = DType::F32;
  // false: every tensor is dequantised into the compute dtype (a dense model).
  bool keep_quantized = true;
  bool allow_nonfinite = false;  // load float tensors holding NaN or Inf with a warning
  // A tensor-parallel rank (generate.tp, serve.tp): the model split as
  // Transformer splits it, this rank reading its share of each tensor: whole
  // rows of a row-split one, the blocks of its columns of a column-split one
  // (whole blocks: nk::Error naming the tensor otherwise), raw bytes.
  nn::TensorParallel tp;
};

// The ModelConfig the file's metadata describes. nk::Error naming the file and
// key for a missing or unsupported setting.
ModelConfig gguf_model_config(const GgufFile& f);

GgufModel load_gguf_model(const std::string& path, const GgufLoadOptions& opt = {});
// Whether every rank of tp can hold its share of the quantised tensors of
// f (opened from `path`; each share whole blocks: quant_share_runs),
// without loading them: nk::Error naming the tensor otherwise, as
// load_gguf_model would on each rank.
void check_gguf_tensor_parallel(const GgufFile& f, const std::string& path, int64_t tp);

// Whether `path` names a GGUF file (by its extension, case-insensitively).
bool is_gguf_path(const std::string& path);

}  // namespace nk
