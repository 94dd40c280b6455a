// An HTML page, through the curation extractor (gumbo, then our tree walk).
#include "curate/extract/html_extract.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return nk::fuzz::accept_errors([&] {
    nk::curate::html_to_text({reinterpret_cast<const char*>(data), size});
  });
}
