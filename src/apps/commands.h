// The subcommands of the `nekton` binary.
#pragma once
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "infer/sampler.h"
#include "model/transformer.h"

namespace nk {

struct CommandArgs {
  std::string config_path;             // --config FILE.yaml
  std::vector<std::string> overrides;  // key.sub=value, in order
  bool help = false;
  // Every argument after the command name, as given: for commands that parse
  // their own positional arguments and options (tokenizer).
  std::vector<std::string> args;
};

// Streams the continuation of `prompt` to stdout, stopping at the tokenizer's
// end-of-document token.
void print_sample(Transformer& model, const Tokenizer& tok, const std::string& prompt,
                  int64_t max_tokens, const SamplingConfig& sc);

int cmd_train(const CommandArgs& a);
int cmd_generate(const CommandArgs& a);
int cmd_quickstart(const CommandArgs& a);
int cmd_tokenizer(const CommandArgs& a);  // uses only a.args
int cmd_preprocess(const CommandArgs& a);
int cmd_eval(const CommandArgs& a);  // uses only a.args: perplexity key=value ...

}  // namespace nk
