// A LaTeX source, through the curation extractor's single-pass scanner.
#include "curate/extract/latex_extract.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return nk::fuzz::accept_errors([&] {
    nk::curate::latex_to_text({reinterpret_cast<const char*>(data), size});
  });
}
