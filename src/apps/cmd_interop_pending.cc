// TEMPORARY, branch-local: lets this branch link while the import/export
// subcommands are written in parallel branches. Each branch deletes the
// definitions it implements; the file is deleted when the branches merge.
#include "apps/commands.h"
#include "core/error.h"

namespace nk {

int cmd_export_gguf(const std::vector<std::string>&) {
  fail("export gguf: not in this branch");
}

}  // namespace nk
