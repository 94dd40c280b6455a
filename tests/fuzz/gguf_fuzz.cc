// A GGUF file: the header, metadata and tensor-table checks of GgufFile::open,
// every metadata value read back, then the model, tokenizer and chat
// template loaded from it as `nekton serve --model FILE.gguf` does. Seeds
// (tests/fuzz/corpus/gguf) are tiny models written by `nekton quantize`.
// The model is built only when its RoPE table (context_length x head_dim
// floats, which the file's tensors do not bound) stays under 64 MiB: a
// 16M-position context is a valid config whose table alone passes the
// fuzzer's 2 GiB allocation limit.
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
    {
      auto f = nk::GgufFile::open(path);
      const nk::ModelConfig c = nk::gguf_model_config(*f);
      if (c.max_seq_len * c.head_dim() > (int64_t(1) << 24)) return;
    }
    nk::GgufModel m = nk::load_gguf_model(path);
    if (m.tokenizer) m.tokenizer->decode(m.tokenizer->encode("Hello, wörld 123"));
  });
}
