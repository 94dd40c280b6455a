// A .tiktoken rank file, opened by path as `--tokenizer FILE.tiktoken` does.
#include "fuzz/tokenizer_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path =
      nk::fuzz::write_scratch("vocab.tiktoken", {reinterpret_cast<const char*>(data), size});
  return nk::fuzz::accept_errors([&] { nk::fuzz::exercise_tokenizer(*nk::load_tokenizer(path)); });
}
