// The model a run-time command (generate, serve) runs: a saved model folder
// or a GGUF file (ckpt/gguf_import.h), optionally quantised as it loads
// (`quantize`: ops/quant.h's types), with its tokenizer.
#pragma once
#include <memory>
#include <string>

#include "data/tokenizer/tokenizer.h"
#include "model/transformer.h"
#include "ops/cpu_isa.h"

namespace nk {

struct RunnableModel {
  std::unique_ptr<Transformer> model;
  std::unique_ptr<Tokenizer> tokenizer;
  bool gguf = false;
  std::string gguf_chat_template;  // the GGUF's tokenizer.chat_template ("" if none)
  std::string name;                // the folder's name or the GGUF's general.name
  // Ids besides the tokenizer's eod that end generation (Generator::set_end_ids):
  // a folder's generation_config.json eos_token_id (an id or a list), as
  // Hugging Face's generate() stops at any of them.
  std::vector<int32_t> end_ids;
};

struct ModelSourceKeys {
  std::string prefix;     // "serve", "generate": errors name prefix + ".model" etc.
  std::string model;      // DIR or FILE.gguf
  std::string tokenizer;  // a spec overriding the model's own ("" = the model's)
  std::string dtype = "f32";
  std::string quantize;  // "" (bf16 rows by default, below), none, or a QuantType's name (folders)
  std::string adapter;   // a PEFT adapter folder (dense folders only)
  bool allow_nonfinite = false;
  Device device = kHost;  // where the model runs (PREFIX.device): cuda for dense folders only
};

// The model for inference, its block-quantised weights packed for the
// device's decode kernels (Transformer::pack_quant_weights), its vocabulary
// checked against the tokenizer's (ckpt/model_vocab.h: fewer rows than the
// tokenizer has ids is an error naming PREFIX.model, more are padding,
// logged). nk::Error naming the key for a missing model, an unknown quantize type, a quantize
// or adapter with a GGUF file, an adapter over a quantised model, or a
// device other than the CPU for a GGUF file, a quantised model or an adapter
// (their kernels and the adapter merge are CPU-only).
// Without PREFIX.quantize, a bf16 model folder (PREFIX.dtype=bf16, on the
// CPU, no adapter) is loaded as bf16 rows (ops::QuantType::BF16, logged)
// where the CPU's kernels are below avx512_bf16: dense bf16 products there
// run on f32 copies of each weight made at every call (about 4x slower
// decode); bf16 rows read the same 2-byte weights directly.
// PREFIX.quantize=none keeps them dense.
// Under tensor parallelism (`tp` active: PREFIX.tp > 1) this rank's pieces
// of a dense model folder on the CPU (check_tensor_parallel_source).
RunnableModel load_runnable_model(const ModelSourceKeys& k, const nn::TensorParallel& tp = {});
// nk::Error naming PREFIX.tp where the model cannot be split over `tp`
// tensor-parallel ranks: a GGUF file, quantised weights, an adapter, a
// device other than the CPU (not supported yet), or shapes tp does not
// divide. Nothing for tp 1.
void check_tensor_parallel_source(const ModelSourceKeys& k, int64_t tp);
bool bf16_rows_by_default(const ModelSourceKeys& k, DType compute, ops::CpuIsa isa);

// generation_config.json's eos_token_id in `model_dir` (an id or a list;
// none without the file or the key), the tokenizer's eod left out. nk::Error
// naming the file for an id outside [0, vocab) or a value of another kind.
std::vector<int32_t> generation_end_ids(const std::string& model_dir, const Tokenizer& tok,
                                        int64_t vocab);

// The tokenizer `spec` names, else the one saved with the model in
// `model_dir`, else bytes; an error names `key`.
std::unique_ptr<Tokenizer> load_model_tokenizer(const std::string& spec,
                                                const std::string& model_dir,
                                                const std::string& key);
// Where load_model_tokenizer takes the tokenizer from, in words for messages
// ("KEY 'SPEC'", "the tokenizer saved with the model, 'SPEC'", ...).
std::string tokenizer_source(const std::string& spec, const std::string& model_dir,
                             const std::string& key);

// The doc line of `PREFIX.quantize`.
extern const char* const kQuantizeKeyDoc;

}  // namespace nk
