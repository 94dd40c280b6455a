// A SentencePiece .model (a serialized ModelProto), from its bytes as open()
// reads them.
#include "data/tokenizer/sentencepiece_tokenizer.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/tokenizer_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return nk::fuzz::accept_errors([&] {
    auto t = nk::SentencePieceTokenizer::from_bytes({reinterpret_cast<const char*>(data), size},
                                                    "tokenizer.model");
    nk::fuzz::exercise_tokenizer(*t);
  });
}
