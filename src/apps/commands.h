// The subcommands of the `nekton` binary.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer/tokenizer.h"
#include "infer/model_source.h"
#include "infer/sampler.h"
#include "model/transformer.h"
#include "train/train_config.h"

namespace nk {

struct CommandArgs {
  std::string config_path;             // --config FILE.yaml
  std::vector<std::string> overrides;  // key.sub=value, in order
  bool help = false;
  int nproc = 0;  // --nproc N (nekton train only): start N processes through mpirun
  // --allow-nonfinite (generate, eval): load weights holding NaN or Inf with a
  // warning instead of refusing them, to inspect a broken model.
  bool allow_nonfinite = false;
  // --print-config (train, finetune): print the settings and the model they
  // build, with the derived sizes marked, then exit.
  bool print_config = false;
  int64_t show_sample = -1;  // --show-sample N (finetune): print sample N as rendered, then exit
  // Every argument after the command name, as given: for commands that parse
  // their own positional arguments and options (tokenizer).
  std::vector<std::string> args;
};

// --config FILE, --help and key=value settings, as most commands take them.
CommandArgs parse_command_args(const std::vector<std::string>& args);

// Streams the continuation of `prompt` to stdout, stopping at the tokenizer's
// end-of-document token.
void print_sample(Transformer& model, const Tokenizer& tok, const std::string& prompt,
                  int64_t max_tokens, const SamplingConfig& sc);

int cmd_train(const CommandArgs& a);
int cmd_finetune(const CommandArgs& a);
int cmd_align(const CommandArgs& a);
int cmd_generate(const CommandArgs& a);
int cmd_serve(const CommandArgs& a);  // uses only a.args (--model DIR, then as parse_command_args)
int cmd_quickstart(const CommandArgs& a);
int cmd_tokenizer(const CommandArgs& a);  // uses only a.args
int cmd_preprocess(const CommandArgs& a);
// Every key of an align recipe: train's, align's and align sampling's
// (nekton align, and nekton estimate of an align recipe).
ConfigSchema align_schema();
int cmd_eval(const CommandArgs& a);      // uses only a.args: perplexity key=value ...
int eval_reward(const CommandArgs& a);   // nekton eval reward (cmd_eval_reward.cc)
int eval_tasks(const CommandArgs& a);    // nekton eval tasks (cmd_eval_tasks.cc)
int cmd_curate(const CommandArgs& a);    // uses only a.args: [train-classifier] ...
int cmd_import(const CommandArgs& a);    // import hf ...      (uses only a.args)
int cmd_export(const CommandArgs& a);    // export hf|gguf ... (uses only a.args)
int cmd_quantize(const CommandArgs& a);  // quantize MODEL OUT.gguf ... (uses only a.args)
int cmd_estimate(const CommandArgs& a);  // [--config F] [key=value ...] [--json] ... (a.args)
int cmd_plot(const CommandArgs& a);      // RUN_DIR... [--metric M] [--out F.png] (a.args)
int cmd_autoconfig(
    const CommandArgs& a);  // RECIPE_OR_KEYS... --nodes N --procs-per-node P (a.args)

// --print-config of train, finetune and align (cmd_train.cc).
int print_config(const Config& c, const TrainConfig& cfg);

// The subcommands cmd_import/cmd_export dispatch to; args[0] is the format
// ("hf", "gguf"), the rest are its own positional arguments and options.
int cmd_import_hf(const std::vector<std::string>& args);
int cmd_export_hf(const std::vector<std::string>& args);
int cmd_export_gguf(const std::vector<std::string>& args);
int cmd_curate_train_classifier(const std::vector<std::string>& args);

}  // namespace nk
