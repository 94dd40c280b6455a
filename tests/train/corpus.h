// A small corpus of real-looking text the training tests share, written once
// into the build folder (through a renamed temporary: test binaries that run
// at the same time never read it half-written).
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include "test_paths.h"

namespace nk::test {

inline std::string corpus_path() {
  const std::filesystem::path p = std::filesystem::path(NK_BINARY_DIR) / "test_corpus.txt";
  if (!std::filesystem::exists(p)) {
    const std::filesystem::path tmp = p.string() + "." + std::to_string(::getpid());
    {
      std::ofstream o(tmp);
      for (int i = 0; i < 400; ++i)
        o << "The quick brown fox " << i << " jumps over the lazy dog. Water is wet.\n";
    }
    std::filesystem::rename(tmp, p);
  }
  return p.string();
}

}  // namespace nk::test
