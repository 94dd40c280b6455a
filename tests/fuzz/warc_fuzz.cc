// A WARC or WET file (plain or gzip, told by its magic bytes): read as
// `nekton curate` reads one input shard, records decoded, charsets sniffed and
// pages transcoded, with batches small enough that records straddle them.
#include "curate/pipeline/input.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path =
      nk::fuzz::write_scratch("data.warc", {reinterpret_cast<const char*>(data), size});
  return nk::fuzz::accept_errors([&] {
    nk::curate::InputOptions opt;
    nk::curate::Shard shard;
    shard.format = nk::curate::SourceFormat::Warc;
    shard.files.emplace_back(path, nk::curate::SourceFormat::Warc);
    nk::curate::ShardReader reader(shard, opt);
    std::vector<nk::curate::InputRecord> recs;
    while (reader.next(recs, 512)) {
    }
  });
}
