// Nekton's tokenizer.json with the vocab.tiktoken beside it, as a tokenizer folder.
#include "fuzz/tokenizer_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return nk::fuzz::fuzz_tokenizer_dir(data, size, "tokenizer.json", "vocab.tiktoken");
}
