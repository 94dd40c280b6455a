// Saves a randomly initialised model of a preset as a model folder (with a
// tokenizer stored beside it), for the benchmarks that need files: the GGUF
// exports compared with llama.cpp (bench/run_quant_bench.sh). Usage:
//   save_random_model PRESET DIR [TOKENIZER]   (tokenizer default: bytes)
#include <fmt/format.h>

#include "ckpt/model_io.h"
#include "core/error.h"
#include "data/tokenizer/tokenizer.h"
#include "model/model_config.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr, "usage: save_random_model PRESET DIR [TOKENIZER]\n");
    return 1;
  }
  try {
    nk::Transformer m(nk::model_preset(argv[1]), nk::DType::F32, 1);
    nk::save_model(argv[2], m);
    nk::store_tokenizer(argc > 3 ? argv[3] : "bytes", argv[2]);
  } catch (const nk::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
