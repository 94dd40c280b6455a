#include "data/byte_tokenizer.h"

#include "core/error.h"

namespace nk {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
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

}  // namespace nk
