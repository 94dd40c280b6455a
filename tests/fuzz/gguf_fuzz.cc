// A GGUF file: the header, metadata and tensor-table checks of GgufFile::open,
// every metadata value read back, then the model, tokenizer and chat
// template loaded from it as `nekton serve --model FILE.gguf` does. Seeds
// (tests/fuzz/corpus/gguf) are tiny models written by `nekton quantize`.
#include "ckpt/gguf_import.h"
#include "ckpt/gguf_reader.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path =
      nk::fuzz::write_scratch("model.gguf", {reinterpret_cast<const char*>(data), size});
  return nk::fuzz::accept_errors([&] {
    {
      auto f = nk::GgufFile::open(path);
      for (const auto& t : f->tensors()) (void)f->find(t.name);
    }
    nk::GgufModel m = nk::load_gguf_model(path);
    if (m.tokenizer) m.tokenizer->decode(m.tokenizer->encode("Hello, wörld 123"));
  });
}
