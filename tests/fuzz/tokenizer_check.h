// After a tokenizer file parses: encode and decode some text, since a vocabulary
// that loads but holds inconsistent tables fails only when used.
#pragma once
#include <vector>

#include "data/tokenizer/tokenizer.h"
#include "fuzz/fuzz_util.h"

namespace nk::fuzz {

inline void exercise_tokenizer(const Tokenizer& t) {
  static constexpr std::string_view kText =
      "Hello world, 123 <|endoftext|> caf\xc3\xa9 \xff\xfe\n\n  tabs\tand \xe6\x97\xa5\xe6\x9c\xac";
  std::vector<int32_t> ids;
  t.encode_with_specials(kText, ids);
  t.encode(kText, ids);
  t.decode(ids);
  for (const auto& s : t.special_tokens()) t.token_bytes(s.second);
  if (t.eod_id() >= 0) t.token_bytes(t.eod_id());
}

// A tokenizer folder of two files (the input split by kFileSeparator), opened
// by `--tokenizer DIR`.
inline int fuzz_tokenizer_dir(const uint8_t* data, size_t size, const std::string& first,
                              const std::string& second) {
  std::vector<std::string_view> files = split_files(data, size, 2);
  write_scratch(first, files[0]);
  write_scratch(second, files[1]);
  return accept_errors([&] { exercise_tokenizer(*load_tokenizer(scratch_dir().string())); });
}

}  // namespace nk::fuzz
