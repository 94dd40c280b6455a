// Saves a randomly initialised model of a preset as a model folder (with a
// tokenizer stored beside it), for the benchmarks that need files: the GGUF
// exports compared with llama.cpp (bench/run_quant_bench.sh,
// bench/run_moe_quant_bench.sh). Usage:
//   save_random_model PRESET DIR [TOKENIZER [KEY=INT ...]]
// (tokenizer default: bytes); each KEY=INT sets that config.json key of the
// preset (d_model=1024 moe.num_experts=8 ...).
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>

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
    nk::ModelConfig c = nk::model_preset(argv[1]);
    if (argc > 4) {
      nlohmann::json j = nlohmann::json::parse(nk::model_config_to_json(c));
      for (int i = 4; i < argc; ++i) {
        const std::string kv = argv[i];
        const size_t eq = kv.find('=');
        // KEY or OBJECT.KEY (moe.num_experts), as config.json nests them.
        const std::string key = kv.substr(0, std::min(eq, kv.size()));
        const size_t dot = key.find('.');
        nlohmann::json& obj = dot == std::string::npos ? j : j[key.substr(0, dot)];
        const std::string leaf = dot == std::string::npos ? key : key.substr(dot + 1);
        if (eq == std::string::npos || !obj.is_object() || !obj.contains(leaf))
          nk::fail("'{}' is not KEY=INT with KEY a config.json key", kv);
        obj[leaf] = std::stoll(kv.substr(eq + 1));
      }
      c = nk::model_config_from_json(j.dump(), "overrides");
    }
    nk::Transformer m(c, nk::DType::F32, 1);
    nk::save_model(argv[2], m);
    nk::store_tokenizer(argc > 3 ? argv[3] : "bytes", argv[2]);
  } catch (const nk::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
