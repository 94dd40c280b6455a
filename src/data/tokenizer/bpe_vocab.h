// A byte-level BPE vocabulary as data: what the loaders of GPT-2/tiktoken files
// produce, what the trainer produces, and what the savers write.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace nk {

struct BpeVocab {
  // tokens[r] is the byte string of the token with rank r; its id is r. Every
  // single byte is a token. An empty string is a hole: no token has that rank
  // (p50k_base has none at 50256, where its <|endoftext|> sits). Merges are implied: a token's rank
  // orders the merge that makes it (tiktoken's convention; GPT-2's encoder.json has id == rank).
  std::vector<std::string> tokens;
  // Pre-tokenization regex in PCRE2/tiktoken syntax (tiktoken's pat_str).
  std::string pattern;
  // Special tokens (text, id): ids at or above tokens.size(), or holes.
  std::vector<std::pair<std::string, int32_t>> specials;
  std::string name;  // "gpt2", "cl100k_base", ... or the file it came from
};

}  // namespace nk
