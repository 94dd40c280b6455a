// TEMPORARY, branch-local: lets this branch link while the import/export
// subcommands are written in parallel branches. Each branch deletes the
// definitions it implements; the file is deleted when the branches merge.
#include "apps/commands.h"
#include "core/error.h"

namespace nk {

int cmd_import_hf(const std::vector<std::string>&) {
  fail("import hf: not in this branch");
}
int cmd_export_hf(const std::vector<std::string>&) {
  fail("export hf: not in this branch");
}

}  // namespace nk
