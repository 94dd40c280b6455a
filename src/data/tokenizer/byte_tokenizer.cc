#include "data/tokenizer/byte_tokenizer.h"

#include "core/error.h"

namespace nk {

void ByteTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  size_t n0 = out.size();
  out.resize(n0 + text.size());
  for (size_t i = 0; i < text.size(); ++i) out[n0 + i] = static_cast<unsigned char>(text[i]);
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id == kEot) continue;
    if (id < 0 || id > 255)
      fail("token id {} at position {} is outside the byte vocabulary [0, {})", id, i,
           vocab_size());
    out.push_back(static_cast<char>(id));
  }
  return out;
}

std::string ByteTokenizer::token_bytes(int32_t id) const {
  if (id == kEot) return "<|endoftext|>";
  if (id < 0 || id > 255) fail("token id {} is outside the byte vocabulary [0, 257)", id);
  return std::string(1, static_cast<char>(id));
}

void ByteTokenizer::encode_with_specials(std::string_view text, std::vector<int32_t>& out) const {
  const auto specials = special_tokens();
  split_on_specials(
      text, specials, [&](std::string_view t) { encode(t, out); },
      [&](int32_t id) { out.push_back(id); });
}

}  // namespace nk
