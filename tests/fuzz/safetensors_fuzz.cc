// A .safetensors file: the header checks of SafetensorsFile::open, then every
// tensor read back (what `nekton import` and load_model do with it).
#include "ckpt/safetensors.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path =
      nk::fuzz::write_scratch("model.safetensors", {reinterpret_cast<const char*>(data), size});
  return nk::fuzz::accept_errors([&] {
    nk::SafetensorsFile f = nk::SafetensorsFile::open(path);
    for (const nk::SafetensorsEntry& e : f.entries()) f.get(e.name);
  });
}
