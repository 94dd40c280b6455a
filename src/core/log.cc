#include "core/log.h"

namespace nk {
static LogLevel g_level = LogLevel::Info;
LogLevel log_level() {
  return g_level;
}
void set_log_level(LogLevel l) {
  g_level = l;
}
}  // namespace nk
