// Errors: `Error` for anything a user can cause (bad config, missing file,
// corrupt data); `NK_CHECK` for programmer errors (violated invariants).
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace nk {

// A user-facing error. The message names the file, line, key or tensor.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
  // Returns a new error whose message is "context: <this message>".
  Error with_context(const std::string& context) const { return Error(context + ": " + what()); }
};

// A broken invariant inside Nekton: a bug, not a user mistake.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& msg) : std::logic_error(msg) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace nk

#define NK_CHECK(cond, ...)                                                                    \
  do {                                                                                         \
    if (!(cond))                                                                               \
      throw ::nk::InternalError(fmt::format("{}:{}: check failed: {}: {}", __FILE__, __LINE__, \
                                            #cond, fmt::format(__VA_ARGS__)));                 \
  } while (0)
