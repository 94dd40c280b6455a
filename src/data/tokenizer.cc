#include "data/tokenizer.h"

#include <cstdlib>

#include "core/error.h"
#include "data/bpe_files.h"
#include "data/byte_tokenizer.h"

#ifndef NK_DEFAULT_ASSETS_DIR
#define NK_DEFAULT_ASSETS_DIR "assets"
#endif

namespace nk {

std::string assets_dir() {
  const char* env = std::getenv("NEKTON_ASSETS");
  return env && *env ? std::string(env) : std::string(NK_DEFAULT_ASSETS_DIR);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "bytes") return std::make_unique<ByteTokenizer>();
  if (auto bpe = open_bpe_tokenizer(spec)) return bpe;
  fail("tokenizer '{}': unknown name and not a tokenizer file or folder", spec);
}

}  // namespace nk
