// Minimal leveled logging to stderr.
#pragma once
#include <fmt/format.h>

#include <cstdio>

namespace nk {

enum class LogLevel { Debug, Info, Warn, Error };
LogLevel log_level();
void set_log_level(LogLevel l);

template <typename... Args>
void log(LogLevel l, fmt::format_string<Args...> f, Args&&... args) {
  if (l < log_level()) return;
  static const char* tag[] = {"debug", "info", "warn", "error"};
  fmt::print(stderr, "[{}] {}\n", tag[int(l)], fmt::format(f, std::forward<Args>(args)...));
}
#define NK_INFO(...) ::nk::log(::nk::LogLevel::Info, __VA_ARGS__)
#define NK_WARN(...) ::nk::log(::nk::LogLevel::Warn, __VA_ARGS__)

}  // namespace nk
