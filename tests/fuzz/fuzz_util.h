// What every libFuzzer harness of tests/fuzz shares. A harness feeds one input
// to a parser through the entry point the CLI uses. nk::Error is the parser
// rejecting bad input, a valid outcome; anything else escaping (InternalError,
// std::bad_alloc, a json or std::out_of_range exception) aborts, so libFuzzer
// reports it as a finding, as it does crashes, sanitizer reports, hangs
// (-timeout) and huge allocations (-malloc_limit_mb).
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace nk::fuzz {

namespace fs = std::filesystem;

// A folder of this process's own (libFuzzer -jobs runs several processes),
// removed at exit; parsers that only open paths read their input from there.
inline const fs::path& scratch_dir() {
  static const fs::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/nk_fuzz_XXXXXX";
    if (!mkdtemp(tmpl.data())) std::abort();
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(scratch_dir(), ec);
    });
    return fs::path(tmpl);
  }();
  return dir;
}

// Writes `bytes` as scratch_dir()/name (replacing it) and returns the path.
inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  fs::path p = scratch_dir() / name;
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
  return p.string();
}

// Inputs of formats that come as several files hold them one after another,
// separated by this line (the seeds in tests/fuzz/corpus show it).
inline constexpr std::string_view kFileSeparator = "\n--- nk-fuzz next file ---\n";

// The `n` files of one input; missing ones are empty.
inline std::vector<std::string_view> split_files(const uint8_t* data, size_t size, size_t n) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < n) {
    size_t at = rest.find(kFileSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(rest.substr(0, at));
    rest.remove_prefix(at + kFileSeparator.size());
  }
  parts.push_back(rest);
  parts.resize(n);
  return parts;
}

// Runs `parse`; nk::Error (the parser's refusal) is fine, the rest propagates.
template <class F>
int accept_errors(F&& parse) {
  try {
    parse();
  } catch (const nk::Error&) {
  }
  return 0;
}

}  // namespace nk::fuzz
