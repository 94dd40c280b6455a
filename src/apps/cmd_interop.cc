// `nekton import FORMAT ...` and `nekton export FORMAT ...`: dispatch by format.
#include <fmt/format.h>

#include "apps/commands.h"
#include "core/error.h"

namespace nk {

namespace {

using Sub = int (*)(const std::vector<std::string>&);

int dispatch(const char* verb, const CommandArgs& a,
             const std::vector<std::pair<const char*, Sub>>& subs, const char* usage) {
  if (a.args.empty() || a.args[0] == "--help" || a.args[0] == "-h") {
    fmt::print("{}", usage);
    return a.args.empty() ? 1 : 0;
  }
  for (auto& [name, fn] : subs)
    if (a.args[0] == name) return fn(a.args);
  std::string known;
  for (auto& [name, fn] : subs) known += std::string(known.empty() ? "" : ", ") + name;
  fail("{}: unknown format '{}' (known: {})", verb, a.args[0], known);
}

}  // namespace

int cmd_import(const CommandArgs& a) {
  return dispatch("import", a, {{"hf", cmd_import_hf}},
                  "usage: nekton import hf HF_DIR OUT_DIR [options]   (nekton import hf --help)\n");
}

int cmd_export(const CommandArgs& a) {
  return dispatch(
      "export", a, {{"hf", cmd_export_hf}, {"gguf", cmd_export_gguf}},
      "usage: nekton export hf CKPT OUT_DIR [options]     (nekton export hf --help)\n"
      "       nekton export gguf CKPT OUT.gguf [options] (nekton export gguf --help)\n");
}

}  // namespace nk
