// The simplest tokenizer: one token per byte (ids 0..255) plus an end-of-text
// token. Needs no training and round-trips any byte string, so it is what the
// quickstart and the tests use before a BPE vocabulary exists.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nk {

class ByteTokenizer {
 public:
  static constexpr int32_t kEot = 256;  // <|endoftext|>
  int64_t vocab_size() const { return 257; }
  std::vector<int32_t> encode(std::string_view text) const;
  // kEot decodes to nothing; an id outside [0, 257) is an nk::Error.
  std::string decode(const std::vector<int32_t>& ids) const;
};

}  // namespace nk
