// `nekton export gguf MODEL_DIR OUT.gguf` and `nekton quantize MODEL_DIR OUT.gguf`:
// a Llama-family or GPT-2 model as llama.cpp's GGUF, in one type or a
// quantisation recipe, with its tokenizer.
#include <fmt/format.h>

#include <filesystem>

#include "apps/arg_parser.h"
#include "apps/commands.h"
#include "ckpt/gguf_export.h"
#include "ckpt/gguf_import.h"
#include "core/error.h"
#include "core/progress.h"

namespace nk {

namespace {

const char* kExportGgufUsage =
    "usage: nekton export gguf MODEL_DIR OUT.gguf [--type TYPE] [--name NAME] [--tokenizer SPEC]\n"
    "       nekton quantize MODEL_DIR|IN.gguf OUT.gguf [--type TYPE] [--allow-requantize] ...\n"
    "                          (the same, --type q4_k_m by default; a GGUF input is written\n"
    "                          again with the new types, its metadata kept)\n"
    "\n"
    "Writes a saved model (config.json + model.safetensors, as train saves it) of\n"
    "the Llama family (llama, qwen2, mistral) or GPT-2 as one GGUF v3 file that\n"
    "llama.cpp runs: its hyper-parameters under llama.cpp's architecture name, the\n"
    "tokenizer as tokenizer.ggml.* metadata (SentencePiece as \"llama\", byte-level\n"
    "BPE as \"gpt2\" with merges, with special tokens and BOS/EOS ids), and the\n"
    "weights under llama.cpp's names (Llama: q and k rows permuted to llama.cpp's\n"
    "rotary layout). The tokenizer is the one stored with the model, or --tokenizer\n"
    "SPEC: llama.cpp cannot load a GGUF without one, so a model with none stored\n"
    "needs it, e.g. --tokenizer gpt2, --tokenizer tok/spm.model,\n"
    "--tokenizer path/to/gpt2-folder (encoder.json + vocab.bpe).\n";

int run_export(const std::string& command, const std::vector<std::string>& args, size_t skip,
               const std::string& default_type) {
  CommandLine cl(command, args, skip);
  GgufExportOptions opt;
  opt.type = default_type;
  bool allow_requantize = false;
  cl.bind_with<std::string>("--type", opt.type,
                            "matrix types: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, or q4_k_m "
                            "(llama.cpp's mix of q4_k and q6_k); norm weights and biases are "
                            "always f32, and rows too short for a type's block fall back (q8_0, "
                            "then f16)",
                            [&](const std::string& t) {
                              try {
                                check_gguf_recipe(t);
                              } catch (const Error& e) {
                                throw e.with_context(command + ": --type");
                              }
                              opt.type = t;
                            });
  cl.bind("--name", opt.name, "general.name (default: the model folder's name)");
  cl.bind("--allow-nonfinite", opt.allow_nonfinite,
          "write weights holding NaN or Inf (with a warning) instead of refusing them");
  cl.bind("--tokenizer", opt.tokenizer,
          "the tokenizer to write, as data.tokenizer takes it (a name such as gpt2 or "
          "cl100k_base, a SentencePiece FILE.model, a BPE folder, a FILE.tiktoken, bytes); "
          "default: the one stored with the model");
  cl.bind("--allow-requantize", allow_requantize,
          "a GGUF input whose matrices are already block-quantised is quantised again");
  std::string progress = "auto";
  cl.bind("--progress", progress,
          "auto (an updating line on a terminal, else a log line every 10 s), bar, log or none");
  if (cl.help()) {
    fmt::print("{}", cl.help_text(kExportGgufUsage));
    return 0;
  }
  // Gone: llama.cpp refuses to load a GGUF without tokenizer metadata.
  if (cl.has("--no-tokenizer"))
    fail(
        "{}: --no-tokenizer is no longer accepted: llama.cpp cannot load a GGUF without a "
        "tokenizer; give the model's tokenizer with --tokenizer SPEC (e.g. --tokenizer gpt2 or "
        "--tokenizer path/to/spm.model)",
        command);
  std::vector<std::string> pos = cl.finish();
  if (pos.size() != 2)
    fail(
        "{}: expected MODEL_DIR (or IN.gguf) and OUT.gguf, got {} argument(s) (see `nekton {} "
        "--help`)",
        command, pos.size(), command);
  const std::string &dir = pos[0], &out = pos[1];
  if (std::filesystem::is_directory(out)) fail("{}: '{}' is a folder, not a file", command, out);
  const bool gguf_in = std::filesystem::is_regular_file(dir) && is_gguf_path(dir);
  if (gguf_in && (!opt.name.empty() || !opt.tokenizer.empty() || opt.allow_nonfinite))
    fail(
        "{}: --name, --tokenizer and --allow-nonfinite apply to a model folder; a GGUF input "
        "keeps its metadata",
        command);
  if (!gguf_in && allow_requantize) fail("{}: --allow-requantize applies to a GGUF input", command);
  Progress bar(command, parse_progress_mode(progress, command + ": --progress"));
  opt.progress = &bar;
  GgufExportResult r;
  try {
    r = gguf_in ? requantize_gguf(dir, out, opt.type, allow_requantize, &bar)
                : export_gguf(dir, out, opt);
  } catch (const Error& e) {
    throw e.with_context(command);
  }
  fmt::print("wrote {}: {} tensors ({}), tokenizer {}\n", out, r.tensors, opt.type,
             r.tokenizer.empty() ? "none" : r.tokenizer);
  return 0;
}

}  // namespace

int cmd_export_gguf(const std::vector<std::string>& args) {
  return run_export("export gguf", args, 1, "f16");
}

int cmd_quantize(const CommandArgs& a) {
  return run_export("quantize", a.args, 0, "q4_k_m");
}

}  // namespace nk
