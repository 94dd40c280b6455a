// `nekton import hf HF_DIR OUT_DIR` and `nekton export hf MODEL_DIR OUT_DIR`:
// Hugging Face checkpoints of Llama-family and GPT-2 models (ckpt/hf_io.h).
#include <fmt/format.h>

#include <fmt/ranges.h>

#include <algorithm>

#include "apps/arg_parser.h"
#include "apps/commands.h"
#include "ckpt/hf_io.h"
#include "core/error.h"
#include "core/progress.h"

namespace nk {

namespace {

const char* kImportUsage =
    "usage: nekton import hf HF_DIR OUT_DIR [--dtype f32|bf16|f16] [--overwrite]\n"
    "\n"
    "Converts a Hugging Face checkpoint folder into a Nekton model folder (as\n"
    "`nekton train` saves one: config.json + model.safetensors, which `nekton\n"
    "generate` and training load).\n"
    "\n"
    "HF_DIR holds config.json (architectures LlamaForCausalLM, MistralForCausalLM\n"
    "or GPT2LMHeadModel) and model.safetensors, or shards named by\n"
    "model.safetensors.index.json; tensors may be stored f32, bf16 or f16.\n"
    "Tokenizer files (tokenizer.json, tokenizer.model, vocab.json + merges.txt,\n"
    "tokenizer_config.json, special_tokens_map.json, added_tokens.json) are copied\n"
    "into OUT_DIR/tokenizer/ and recorded for generation when Nekton can load them\n"
    "(GPT-2's vocab.json + merges.txt, SentencePiece's tokenizer.model).\n"
    "OUT_DIR/hf.json records the source's dtype and config for `export hf`.\n"
    "Unsupported configs (rope_scaling, biases in Llama, sliding windows, other\n"
    "activations) and bad files are errors naming the key, file or tensor; OUT_DIR\n"
    "is written in a temporary folder and renamed, so a failure leaves nothing.\n";

const char* kExportUsage =
    "usage: nekton export hf MODEL_DIR OUT_DIR [--dtype bf16|f16|f32]\n"
    "                        [--max-shard-size 5GB] [--overwrite]\n"
    "                        [--merge-lora] [--adapter PEFT_DIR]\n"
    "\n"
    "Writes a Nekton model folder (config.json + model.safetensors) as a Hugging\n"
    "Face checkpoint that transformers' from_pretrained loads: config.json\n"
    "(LlamaForCausalLM or GPT2LMHeadModel), model.safetensors or shards\n"
    "model-0000i-of-0000n.safetensors + model.safetensors.index.json, and the\n"
    "tokenizer files kept in MODEL_DIR/tokenizer/ (Nekton's encoder.json + vocab.bpe\n"
    "as vocab.json + merges.txt, a SentencePiece .model as tokenizer.model).\n"
    "A tied head is written once, as model.embed_tokens.weight / transformer.wte.weight.\n";

DType parse_weight_dtype(const std::string& s, const char* command) {
  if (s == "f32" || s == "float32") return DType::F32;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "f16" || s == "float16") return DType::F16;
  fail("{}: --dtype '{}' is not one of f32, bf16, f16", command, s);
}

std::string human_bytes(uint64_t bytes) {
  if (bytes < 1'000'000) return fmt::format("{:.1f} kB", double(bytes) / 1e3);
  if (bytes < 1'000'000'000) return fmt::format("{:.1f} MB", double(bytes) / 1e6);
  return fmt::format("{:.2f} GB", double(bytes) / 1e9);
}

constexpr const char* kProgressDoc =
    "auto (an updating line on a terminal, else a log line every 10 s), bar, log or none";

}  // namespace

int cmd_import_hf(const std::vector<std::string>& args) {
  const char* cmd = "import hf";
  CommandLine cl(cmd, args, 1);
  HfImportOptions opt;
  cl.bind_with<std::string>(
      "--dtype", dtype_name(opt.storage),
      "dtype of OUT_DIR/model.safetensors: f32 (the master weights), bf16 or f16; bf16/f16 "
      "sources widen exactly",
      [&](const std::string& s) { opt.storage = parse_weight_dtype(s, cmd); });
  cl.bind("--overwrite", opt.overwrite, "replace OUT_DIR if it exists and is not empty");
  cl.bind("--allow-nonfinite", opt.allow_nonfinite,
          "write weights holding NaN or Inf (with a warning) instead of refusing them");
  std::string progress = "auto";
  cl.bind("--progress", progress, kProgressDoc);
  if (cl.help()) {
    fmt::print("{}", cl.help_text(kImportUsage));
    return 0;
  }
  std::vector<std::string> pos = cl.finish();
  if (pos.size() != 2) {
    fmt::print(stderr, "{}", kImportUsage);
    fail("{}: expected HF_DIR and OUT_DIR, got {} argument(s)", cmd, pos.size());
  }
  Progress bar(cmd, parse_progress_mode(progress, "import hf: --progress"));
  opt.progress = &bar;
  HfImportReport r = import_hf(pos[0], pos[1], opt);
  const ModelConfig& c = r.config;
  fmt::print(
      "imported {} ({}, {} layers, d_model {}, {} heads / {} kv, vocab {}, {:.2f}M params, "
      "{} on disk, {} file(s))\n",
      pos[0], r.architecture, c.n_layer, c.d_model, c.n_head, c.n_kv_head, c.vocab_size,
      double(r.n_params) / 1e6, r.source_dtype, r.weight_files.size());
  if (r.tokenizer_files.empty())
    fmt::print("tokenizer: no tokenizer files in {}\n", pos[0]);
  else if (r.tokenizer_spec.empty())
    fmt::print("tokenizer: copied {} (not a format Nekton reads; not recorded for generation)\n",
               fmt::join(r.tokenizer_files, ", "));
  else
    fmt::print("tokenizer: copied {} and recorded for generation\n",
               fmt::join(r.tokenizer_files, ", "));
  fmt::print("wrote {}\n", pos[1]);
  return 0;
}

int cmd_export_hf(const std::vector<std::string>& args) {
  const char* cmd = "export hf";
  CommandLine cl(cmd, args, 1);
  HfExportOptions opt;
  cl.bind_with<std::string>(
      "--dtype", "",
      "storage dtype, bf16, f16 or f32; default: the dtype the model was imported from (so "
      "import + export reproduces the tensors bit for bit), else bf16 for llama and f32 for gpt2",
      [&](const std::string& s) { opt.dtype = parse_weight_dtype(s, cmd); });
  cl.bind_with<std::string>(
      "--max-shard-size", "5GB", "largest shard: 500MB, 2GiB, or bytes", [&](const std::string& s) {
        opt.max_shard_bytes = parse_byte_size(s, "export hf: --max-shard-size");
      });
  cl.bind("--overwrite", opt.overwrite, "replace OUT_DIR if it exists and is not empty");
  cl.bind("--allow-nonfinite", opt.allow_nonfinite,
          "write weights holding NaN or Inf (with a warning) instead of refusing them");
  cl.bind("--merge-lora", opt.merge_adapters,
          "merge the model's adapters, LoRA or IA3 (or --adapter's), into the weights");
  cl.bind("--adapter", opt.adapter,
          "a LoRA or IA3 adapter folder in PEFT's format to merge into MODEL_DIR's weights");
  std::string progress = "auto";
  cl.bind("--progress", progress, kProgressDoc);
  if (cl.help()) {
    fmt::print("{}", cl.help_text(kExportUsage));
    return 0;
  }
  std::vector<std::string> pos = cl.finish();
  if (pos.size() != 2) {
    fmt::print(stderr, "{}", kExportUsage);
    fail("{}: expected MODEL_DIR and OUT_DIR, got {} argument(s)", cmd, pos.size());
  }
  Progress bar(cmd, parse_progress_mode(progress, "export hf: --progress"));
  opt.progress = &bar;
  HfExportReport r = export_hf(pos[0], pos[1], opt);
  fmt::print("exported {} to {}: {} tensor bytes as {} in {} file(s)\n", pos[0], pos[1],
             human_bytes(r.total_bytes), dtype_name(r.dtype), r.weight_files.size());
  if (!r.tokenizer_files.empty()) fmt::print("tokenizer: {}\n", fmt::join(r.tokenizer_files, ", "));
  if (!r.tokenizer_note.empty()) fmt::print("tokenizer: {}\n", r.tokenizer_note);
  return 0;
}

}  // namespace nk
