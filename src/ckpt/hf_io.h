// Hugging Face checkpoints of Llama-family and GPT-2 models, in and out.
//
// An HF folder holds config.json (`architectures`, the shape keys), the
// weights as model.safetensors or as shards model-0000i-of-0000n.safetensors
// with model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map":
// {tensor: file}}), and the tokenizer files.
//
// Name and layout mapping (Nekton name <- HF name):
//   llama  wte                  <- model.embed_tokens.weight
//          h.L.ln1.weight       <- model.layers.L.input_layernorm.weight
//          h.L.attn.qkv.weight  <- self_attn.{q,k,v}_proj.weight stacked by rows
//          h.L.attn.proj.weight <- self_attn.o_proj.weight
//          h.L.ln2.weight       <- post_attention_layernorm.weight
//          h.L.mlp.up.weight    <- mlp.{gate,up}_proj.weight stacked by rows
//          h.L.mlp.down.weight  <- mlp.down_proj.weight
//          ln_f.weight          <- model.norm.weight; lm_head.weight <- lm_head.weight
//          (RoPE is rotate-half on both sides: q/k rows are not permuted.)
//   qwen2  as llama, plus h.L.attn.qkv.bias <- self_attn.{q,k,v}_proj.bias stacked
//   gpt2   wte, wpe, ln_f.*     <- [transformer.]wte.weight, wpe.weight, ln_f.*
//          h.L.ln1.* / ln2.*    <- h.L.ln_1.* / ln_2.*
//          h.L.attn.qkv.*       <- h.L.attn.c_attn.*   (Conv1D: weight stored [in, out],
//          h.L.attn.proj.*      <- h.L.attn.c_proj.*    so every weight is transposed)
//          h.L.mlp.up.*         <- h.L.mlp.c_fc.*
//          h.L.mlp.down.*       <- h.L.mlp.c_proj.*
//          lm_head.weight       <- lm_head.weight (untied models only)
// Tied heads: HF omits lm_head.weight (or stores a copy of the embeddings,
// which import checks); export omits it, as save_pretrained does.
//
// Every error is an nk::Error naming the file and the config key or tensor;
// outputs are written into a sibling temporary folder and renamed into place,
// so OUT_DIR is either untouched or complete.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/model_config.h"

namespace nk {

class Progress;

// An HF config.json mapped to a ModelConfig. Supported: LlamaForCausalLM and
// MistralForCausalLM (model_type llama/mistral, without attention/MLP biases,
// a sliding window shorter than the context, or another activation than
// silu), Qwen2ForCausalLM (without sliding-window layers), each with
// rope_scaling of type linear, llama3, yarn or longrope (model/rope.h), and
// GPT2LMHeadModel (gelu_new activation, standard attention scaling).
// nk::Error "WHERE: ... 'KEY' ..." otherwise.
struct HfModelInfo {
  ModelConfig config;
  std::string architecture;          // as in config.json, e.g. "LlamaForCausalLM"
  std::optional<DType> torch_dtype;  // config.json's torch_dtype, when given
};
HfModelInfo hf_model_info_from_json(const std::string& text, const std::string& where);

// The config.json export writes for `c` with weights stored as `dtype`.
std::string hf_config_json(const ModelConfig& c, DType dtype);

// The names (and order) of a Nekton model's parameters for `c`.
std::vector<std::string> nekton_param_names(const ModelConfig& c);

struct HfImportOptions {
  // dtype of OUT_DIR/model.safetensors. f32 keeps the master weights exactly
  // (and bf16/f16 sources are widened exactly); bf16/f16 halve the file, and
  // load_model widens them back to f32.
  DType storage = DType::F32;
  bool overwrite = false;  // replace a non-empty OUT_DIR
  // Import tensors holding NaN or Inf (with a warning) instead of refusing.
  bool allow_nonfinite = false;
  Progress* progress = nullptr;  // the source tensors' bytes as they are read
};

struct HfImportReport {
  ModelConfig config;
  std::string architecture;
  std::vector<std::string> weight_files;     // the safetensors files read
  std::string source_dtype;                  // "bf16", "f16", "f32" or "mixed"
  std::vector<std::string> tokenizer_files;  // copied into OUT_DIR/tokenizer/
  std::string tokenizer_spec;  // what store_tokenizer recorded ("" if none could be loaded)
  int64_t n_params = 0;
};

// HF_DIR -> a Nekton model folder OUT_DIR (as save_model writes it: config.json +
// model.safetensors, loadable with load_model) plus hf.json (the source's
// architecture, dtype, tensor-name prefix and config, which export reuses),
// tokenizer/ with the HF tokenizer files and tokenizer.txt when Nekton can load
// them (vocab.json + merges.txt as GPT-2 BPE, tokenizer.model as SentencePiece).
HfImportReport import_hf(const std::string& hf_dir, const std::string& out_dir,
                         const HfImportOptions& opt = {});
// Whether DIR/config.json is a Hugging Face config (it names `architectures`)
// rather than a Nekton model's.
bool is_hf_model_folder(const std::string& dir);
// The ModelConfig of a model folder of either kind: a Nekton folder's
// config.json, or a Hugging Face one's mapped as import maps it.
ModelConfig any_model_folder_config(const std::string& dir);

struct HfExportOptions {
  // Storage dtype; default: the source dtype recorded at import (so import +
  // export reproduces the original tensors bit for bit), else bf16 for llama
  // (as Llama checkpoints are published) and f32 for gpt2 (as GPT-2's are).
  std::optional<DType> dtype;
  uint64_t max_shard_bytes = 5'000'000'000;  // HF's default "5GB"
  bool overwrite = false;
  // Export weights holding NaN or Inf (with a warning) instead of refusing.
  bool allow_nonfinite = false;
  // Merge the model's adapters (LoRA's W + scale B A, IA3's scales; a
  // fine-tuning run's model/) or those of the PEFT adapter folder `adapter`
  // into the weights. A model with adapters is refused without merge_adapters.
  bool merge_adapters = false;
  std::string adapter;
  Progress* progress = nullptr;  // the exported tensors' bytes as they are converted
};

struct HfExportReport {
  DType dtype = DType::F32;
  std::vector<std::string> weight_files;  // in OUT_DIR
  uint64_t total_bytes = 0;               // tensor bytes, as the index's total_size
  std::vector<std::string> tokenizer_files;
  std::string tokenizer_note;  // why a tokenizer the model has was not exported, if so
};

// A Nekton model folder (config.json + model.safetensors) -> an HF folder:
// config.json, model.safetensors or shards + index when the tensors exceed
// max_shard_bytes (a tensor larger than that gets a shard of its own), and the
// tokenizer files found in MODEL_DIR/tokenizer/ (Nekton's encoder.json +
// vocab.bpe are written under HF's names vocab.json + merges.txt when the
// vocabulary uses GPT-2's pre-tokenization pattern, a single SentencePiece
// NAME.model as tokenizer.model, the "gpt2" name as OpenAI's GPT-2 files);
// report.tokenizer_note says why a tokenizer was left out.
HfExportReport export_hf(const std::string& model_dir, const std::string& out_dir,
                         const HfExportOptions& opt = {});

// "5GB", "500MB", "1.5GB", "10GiB", "4096" (bytes); kB/MB/GB/TB are powers of
// 1000, KiB/MiB/GiB/TiB of 1024, case-insensitive. nk::Error naming `what`.
uint64_t parse_byte_size(const std::string& s, const std::string& what);

}  // namespace nk
