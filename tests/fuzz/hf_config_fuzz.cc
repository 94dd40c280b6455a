// A Hugging Face config.json: mapped to a ModelConfig as `nekton import` does,
// then the parameter layout and HF tensor names that import derives from it.
#include "ckpt/hf_io.h"
#include "fuzz/fuzz_util.h"
#include "model/arch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  return nk::fuzz::accept_errors([&] {
    nk::HfModelInfo info = nk::hf_model_info_from_json(text, "config.json");
    nk::model_layout(info.config);
    info.config.architecture().hf_tensors(info.config, "");
  });
}
