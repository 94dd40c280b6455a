// `nekton export gguf MODEL_DIR OUT.gguf`: a Llama-family model as llama.cpp's GGUF.
#include <fmt/format.h>

#include <filesystem>

#include "apps/arg_parser.h"
#include "apps/commands.h"
#include "ckpt/gguf_export.h"
#include "core/error.h"

namespace nk {

namespace {

const char* kUsage =
    "usage: nekton export gguf MODEL_DIR OUT.gguf [--type f32|f16|bf16|q8_0] [--name NAME]\n"
    "                          [--no-tokenizer]\n"
    "\n"
    "Writes a saved Llama-family model (config.json + model.safetensors, as train\n"
    "saves it) as one GGUF v3 file that llama.cpp runs: llama.* hyper-parameters,\n"
    "the tokenizer stored with the model as tokenizer.ggml.* metadata (SentencePiece\n"
    "as \"llama\", byte-level BPE as \"gpt2\" with merges), and the weights under\n"
    "llama.cpp's names, q and k rows permuted to llama.cpp's rotary layout.\n"
    "\n"
    "options:\n"
    "  --type T        matrix type: f32, f16 (default), bf16, or q8_0 (blocks of 32,\n"
    "                  one f16 scale each; rows must be a multiple of 32 long);\n"
    "                  norm weights are always f32\n"
    "  --name NAME     general.name (default: the model folder's name)\n"
    "  --no-tokenizer  export without tokenizer metadata (required when the model\n"
    "                  has no stored tokenizer; llama.cpp cannot run such a file)\n";

}  // namespace

int cmd_export_gguf(const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size(); ++i)
    if (args[i] == "--help" || args[i] == "-h") {
      fmt::print("{}", kUsage);
      return 0;
    }
  Parsed p = parse_options(
      "export gguf", args, 1,
      {{"--type", Arity::kOne}, {"--name", Arity::kOne}, {"--no-tokenizer", Arity::kFlag}});
  if (p.positional.size() != 2)
    fail(
        "export gguf: expected MODEL_DIR and OUT.gguf, got {} argument(s) (see `nekton export "
        "gguf --help`)",
        p.positional.size());
  GgufExportOptions opt;
  if (p.has("--type")) {
    try {
      opt.type = parse_ggml_type(p.one("--type"));
    } catch (const Error& e) {
      throw e.with_context("export gguf: --type");
    }
  }
  if (p.has("--name")) opt.name = p.one("--name");
  opt.tokenizer = !p.has("--no-tokenizer");
  const std::string &dir = p.positional[0], &out = p.positional[1];
  if (std::filesystem::is_directory(out)) fail("export gguf: '{}' is a folder, not a file", out);
  GgufExportResult r;
  try {
    r = export_gguf(dir, out, opt);
  } catch (const Error& e) {
    throw e.with_context("export gguf");
  }
  fmt::print("wrote {}: {} tensors ({}), tokenizer {}\n", out, r.tensors, ggml_type_name(opt.type),
             r.tokenizer.empty() ? "none" : r.tokenizer);
  return 0;
}

}  // namespace nk
