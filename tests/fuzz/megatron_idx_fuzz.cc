// A Megatron indexed dataset, PREFIX.idx + PREFIX.bin (split by
// kFileSeparator): IndexedDataset::open's checks, then every sequence read.
#include <algorithm>

#include "data/dataset/indexed_dataset.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string_view> files = nk::fuzz::split_files(data, size, 2);
  nk::fuzz::write_scratch("data.idx", files[0]);
  std::string bin = nk::fuzz::write_scratch("data.bin", files[1]);
  std::string prefix = bin.substr(0, bin.size() - 4);
  return nk::fuzz::accept_errors([&] {
    auto ds = nk::IndexedDataset::open(prefix);
    // A valid index may hold millions of empty sequences; a few reads suffice.
    for (int64_t s = 0; s < std::min<int64_t>(ds->num_sequences(), 64); ++s) ds->sequence(s);
  });
}
