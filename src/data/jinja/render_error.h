// The error a template raises while it renders: a message, and where in the
// source the node that failed starts (filled in by the innermost node that
// sees it go by). template.cc turns it into an nk::Error naming the
// template, line and column.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace nk::jinja {

struct RenderError {
  static constexpr uint32_t kNoPos = UINT32_MAX;
  std::string message;
  uint32_t pos = kNoPos;  // byte offset in the template's source
  bool raised = false;    // by the template's own raise_exception()
};

template <typename... Args>
[[noreturn]] void render_fail(fmt::format_string<Args...> f, Args&&... args) {
  throw RenderError{fmt::format(f, std::forward<Args>(args)...)};
}

}  // namespace nk::jinja
