// The subcommands of the `nekton` binary.
#pragma once
#include <string>
#include <vector>

namespace nk {

struct CommandArgs {
  std::string config_path;             // --config FILE.yaml
  std::vector<std::string> overrides;  // key.sub=value, in order
  bool help = false;
};

int cmd_train(const CommandArgs& a);
int cmd_generate(const CommandArgs& a);
int cmd_quickstart(const CommandArgs& a);

}  // namespace nk
