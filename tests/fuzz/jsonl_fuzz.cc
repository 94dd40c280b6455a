// A JSONL file (plain or zstd, told by its magic bytes): read in blocks and
// each line's "text" field pulled out, as `nekton preprocess` does.
#include "data/jsonl_reader.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path =
      nk::fuzz::write_scratch("data.jsonl", {reinterpret_cast<const char*>(data), size});
  return nk::fuzz::accept_errors([&] {
    nk::JsonlReader reader(path, 1 << 20);
    nk::JsonFieldReader field("text");
    nk::LineBlock block;
    // Small blocks, so lines straddle block boundaries.
    while (reader.read_block(block, 256)) {
      std::string_view lines = block.lines();
      for (size_t at = 0; at < lines.size();) {
        size_t end = lines.find('\n', at);
        std::string_view text;
        std::string why;
        // The padding read past the line is the block's (its next lines).
        field.read(lines.substr(at, end - at), text, why);
        at = end + 1;
      }
    }
  });
}
