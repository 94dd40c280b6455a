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
    "llama.cpp's names, q and k rows permuted to llama.cpp's rotary layout.\n";

}  // namespace

int cmd_export_gguf(const std::vector<std::string>& args) {
  CommandLine cl("export gguf", args, 1);
  GgufExportOptions opt;
  bool no_tokenizer = false;
  cl.bind_with<std::string>("--type", ggml_type_name(opt.type),
                            "matrix type: f32, f16, bf16, or q8_0 (blocks of 32, one f16 scale "
                            "each; rows a multiple of 32 long); norm weights are always f32",
                            [&](const std::string& t) {
                              try {
                                opt.type = parse_ggml_type(t);
                              } catch (const Error& e) {
                                throw e.with_context("export gguf: --type");
                              }
                            });
  cl.bind("--name", opt.name, "general.name (default: the model folder's name)");
  cl.bind("--allow-nonfinite", opt.allow_nonfinite,
          "write weights holding NaN or Inf (with a warning) instead of refusing them");
  cl.bind("--no-tokenizer", no_tokenizer,
          "export without tokenizer metadata (required when the model has no stored "
          "tokenizer; llama.cpp cannot run such a file)");
  if (cl.help()) {
    fmt::print("{}", cl.help_text(kUsage));
    return 0;
  }
  std::vector<std::string> pos = cl.finish();
  if (pos.size() != 2)
    fail(
        "export gguf: expected MODEL_DIR and OUT.gguf, got {} argument(s) (see `nekton export "
        "gguf --help`)",
        pos.size());
  opt.tokenizer = !no_tokenizer;
  const std::string &dir = pos[0], &out = pos[1];
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
