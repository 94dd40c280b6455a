// The simplest tokenizer: one token per byte (ids 0..255) plus an end-of-text
// token. Needs no training and round-trips any byte string, so it is what the
// tests use when a tokenizer does not matter.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer/tokenizer.h"

namespace nk {

class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kEot = 256;  // <|endoftext|>
  std::string kind() const override { return "bytes"; }
  int64_t vocab_size() const override { return 257; }
  using Tokenizer::encode;
  // Bytes as they are: no UTF-8 replacement, so any byte string round-trips.
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  // "<|endoftext|>" in the text becomes kEot.
  void encode_with_specials(std::string_view text, std::vector<int32_t>& out) const override;
  // kEot decodes to nothing; an id outside [0, 257) is an nk::Error.
  std::string decode(std::span<const int32_t> ids) const override;
  std::string token_bytes(int32_t id) const override;
  int32_t eod_id() const override { return kEot; }
  std::vector<std::pair<std::string, int32_t>> special_tokens() const override {
    return {{"<|endoftext|>", kEot}};
  }
};

}  // namespace nk
