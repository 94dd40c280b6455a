#include "apps/cli.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "apps/commands.h"
#include "core/error.h"
#include "ops/cpu_isa.h"

namespace nk {

namespace {

struct Command {
  int (*run)(const CommandArgs&);
  const char* summary;
  const char* guide;      // the page of docs/ for the user of this command
  bool own_args = false;  // parses CommandArgs::args itself (positional arguments)
};

const std::map<std::string, Command>& commands() {
  static const std::map<std::string, Command> m = {
      {"quickstart",
       {cmd_quickstart,
        "the whole pipeline on the GCIDE dictionary: BPE tokenizer, preprocess, train, sample",
        "docs/getting-started.md"}},
      {"train",
       {cmd_train,
        "pretrain a model (GPT-2, Llama, Mistral, Qwen, MoE) on text or indexed datasets",
        "docs/pretraining.md"}},
      {"finetune",
       {cmd_finetune, "supervised fine-tuning on chat or prompt/answer JSONL, full or PEFT",
        "docs/finetuning.md"}},
      {"align",
       {cmd_align,
        "reward models, DPO/IPO/KTO/ORPO/SimPO, SteerLM, rejection sampling, GRPO/RLOO/PPO",
        "docs/alignment.md"}},
      {"import",
       {cmd_import,
        "import hf DIR OUT: a Hugging Face model (Llama, Mistral, Qwen, Phi-3, GPT-2, MoE)",
        "docs/interop.md", true}},
      {"export",
       {cmd_export, "export hf CKPT DIR | export gguf CKPT FILE: Hugging Face or llama.cpp",
        "docs/interop.md", true}},
      {"generate",
       {cmd_generate, "sample text from a saved model or a GGUF file", "docs/inference.md"}},
      {"quantize",
       {cmd_quantize, "quantize MODEL OUT.gguf --type q4_k_m|q4_0|q8_0|...: llama.cpp's formats",
        "docs/interop.md", true}},
      {"serve",
       {cmd_serve, "an OpenAI-compatible HTTP server (chat, completions, streaming, metrics)",
        "docs/inference.md", true}},
      {"tokenizer",
       {cmd_tokenizer,
        "inspect, encode/decode with, or train a tokenizer (info|encode|decode|train)",
        "docs/data.md", true}},
      {"preprocess",
       {cmd_preprocess, "tokenize JSONL (plain or zstd) into a Megatron .bin/.idx",
        "docs/data.md"}},
      {"curate",
       {cmd_curate,
        "clean, filter and deduplicate text (JSONL, text, HTML, LaTeX) into curated JSONL shards",
        "docs/curation.md", true}},
      {"estimate",
       {cmd_estimate,
        "memory per rank, FLOPs and step time of a training recipe, before it runs; what fits",
        "docs/memory.md", true}},
      {"autoconfig",
       {cmd_autoconfig,
        "search the parallel layouts of a recipe on N nodes, rank them by a step time "
        "calibrated here, measure the best",
        "docs/memory.md", true}},
      {"plot",
       {cmd_plot,
        "draw loss and validation curves of runs' metrics.jsonl side by side (PNG, SVG, HTML)",
        "docs/monitoring.md", true}},
      {"eval",
       {cmd_eval, "evaluate a model: benchmark tasks, perplexity, log-probabilities, rewards",
        "docs/evaluation.md", true}},
  };
  return m;
}

void print_usage() {
  fmt::print(
      "nekton: native LLM training and inference\n\n"
      "usage: nekton <command> [--config FILE.yaml] [key.sub=value ...] [--help]\n\n"
      "commands:\n");
  for (auto& [name, c] : commands()) fmt::print("  {:<12} {}\n", name, c.summary);
  fmt::print(
      "\n`nekton <command> --help` lists every config key with its default.\n"
      "Guides (in the Nekton repository): docs/getting-started.md, then one per task.\n");
}

bool asks_for_help(int argc, char** argv) {
  for (int i = 2; i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return true;
  return false;
}

}  // namespace

CommandArgs parse_command_args(const std::vector<std::string>& argv) {
  CommandArgs a;
  const size_t argc = argv.size();
  for (size_t i = 0; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "--help" || s == "-h") {
      a.help = true;
    } else if (s == "--config") {
      if (i + 1 >= argc) fail("--config needs a file name");
      a.config_path = argv[++i];
    } else if (s.rfind("--config=", 0) == 0) {
      a.config_path = s.substr(9);
    } else if (s == "--nproc" || s.rfind("--nproc=", 0) == 0) {
      std::string n = s == "--nproc" ? (i + 1 < argc ? argv[++i] : "") : s.substr(8);
      char* end = nullptr;
      long v = std::strtol(n.c_str(), &end, 10);
      if (n.empty() || *end != '\0' || v < 1 || v > 1 << 20)
        fail("--nproc needs a process count >= 1, got '{}'", n);
      a.nproc = int(v);
    } else if (s == "--print-config") {
      a.print_config = true;
    } else if (s == "--allow-nonfinite") {
      a.allow_nonfinite = true;
    } else if (s == "--show-sample" || s.rfind("--show-sample=", 0) == 0) {
      std::string n = s == "--show-sample" ? (i + 1 < argc ? argv[++i] : "") : s.substr(14);
      char* end = nullptr;
      long long v = std::strtoll(n.c_str(), &end, 10);
      if (n.empty() || *end != '\0' || v < 0)
        fail("--show-sample needs a sample number >= 0, got '{}'", n);
      a.show_sample = v;
    } else if (s.rfind("--", 0) == 0) {
      fail(
          "unknown option '{}' (options are --config FILE, --help, --nproc N for train, "
          "finetune, align, generate and serve, "
          "--print-config for train and finetune, --show-sample N for finetune and "
          "--allow-nonfinite for generate and eval; settings are key=value)",
          s);
    } else if (s.find('=') == std::string::npos) {
      fail("argument '{}' is not a key=value setting", s);
    } else {
      a.overrides.push_back(s);
    }
  }
  return a;
}

int run_cli(int argc, char** argv) {
  try {
    if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
        !std::strcmp(argv[1], "help")) {
      print_usage();
      return argc < 2 ? 1 : 0;
    }
    auto it = commands().find(argv[1]);
    if (it == commands().end()) {
      fmt::print(stderr, "error: unknown command '{}'\n\n", argv[1]);
      print_usage();
      return 1;
    }
    // Each command's help starts with the guide for its user.
    if (asks_for_help(argc, argv)) {
      fmt::print("Guide: {}\n\n", it->second.guide);
      std::fflush(stdout);
    }
    if (it->second.own_args) {
      CommandArgs a;
      a.args.assign(argv + 2, argv + argc);
      return it->second.run(a);
    }
    CommandArgs a = parse_command_args(std::vector<std::string>(argv + 2, argv + argc));
    if (a.nproc > 0 && std::strcmp(argv[1], "train") != 0 &&
        std::strcmp(argv[1], "finetune") != 0 && std::strcmp(argv[1], "align") != 0 &&
        std::strcmp(argv[1], "generate") != 0)  // (serve reads its own arguments)
      fail("--nproc is an option of nekton train, finetune, align, generate and serve only");
    if (a.print_config && std::strcmp(argv[1], "train") != 0 &&
        std::strcmp(argv[1], "align") != 0 && std::strcmp(argv[1], "finetune") != 0)
      fail("--print-config is an option of nekton train, finetune and align only");
    if (a.show_sample >= 0 && std::strcmp(argv[1], "finetune") != 0)
      fail("--show-sample is an option of nekton finetune only");
    if (a.allow_nonfinite && std::strcmp(argv[1], "generate") != 0)
      fail("--allow-nonfinite is an option of generate, eval, import and export only");
    // The CPU kernels' level (ops/cpu_isa.h), so that a bad NK_CPU_ISA stops
    // the command here, before any worker thread runs a kernel.
    ops::active_cpu_isa();
    return it->second.run(a);
  } catch (const Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    // Sizes from configs and files are bounded (core/limits.h), but a model
    // within the bounds can still exceed this machine's memory.
    fmt::print(stderr, "error: out of memory (the model, batch or input is too large here)\n");
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "internal error: {}\n", e.what());
    return 2;
  }
}

}  // namespace nk
