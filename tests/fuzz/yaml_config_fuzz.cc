// A YAML recipe, read the two ways the CLI reads one: as a training config
// (`nekton train --config`, checked by train_config_from) and as a curation
// pipeline (`nekton curate`).
#include "core/config.h"
#include "curate/pipeline/config.h"
#include "fuzz/fuzz_util.h"
#include "train/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path =
      nk::fuzz::write_scratch("recipe.yaml", {reinterpret_cast<const char*>(data), size});
  static const nk::ConfigSchema schema = nk::train_schema();
  nk::fuzz::accept_errors([&] { nk::train_config_from(nk::Config::load(schema, path, {})); });
  return nk::fuzz::accept_errors([&] { nk::curate::load_pipeline_config(path, {}); });
}
