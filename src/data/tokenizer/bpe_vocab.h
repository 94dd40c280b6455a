// A byte-level BPE vocabulary as data: what the loaders of GPT-2/tiktoken files
// produce, what the trainer produces, and what the savers write.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/limits.h"

namespace nk {

// The ids a vocabulary file of `entries` entries may give, checked before any
// table is sized from them: below twice its entries (real files leave only
// small gaps: p50k_base skips one rank, cl100k_base's specials sit 20 ids past
// its last rank) and below limits::kVocab. nk::Error "WHERE: id ID is out of
// range ..." otherwise, so a tiny file cannot ask for a huge table.
inline void check_vocab_id(int64_t id, int64_t entries, const std::string& where) {
  const int64_t bound = std::min(limits::kVocab, std::max<int64_t>(2 * entries, 512));
  if (id < 0 || id >= bound)
    fail(
        "{}: id {} is out of range: a vocabulary of {} entries has ids below {} (twice its "
        "entries, and at most {})",
        where, id, entries, bound, limits::kVocab);
}

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
  // Hugging Face's normalizer (tokenizer.json's "normalizer", as JSON text),
  // applied to the text between specials before pre-tokenizing; empty: none.
  std::string normalizer;
  // The ids of the specials matched in the normalized text (Hugging Face's
  // added tokens with normalized: true); the others are matched in the raw
  // text first, as Hugging Face's AddedVocabulary does.
  std::vector<int32_t> normalized_specials;
  // The special that ends a document (eod_id()); empty: <|endoftext|>, if a special.
  std::string eod;
  // The special that begins a document (bos_id()); empty: none.
  std::string bos;
  std::string name;  // "gpt2", "cl100k_base", ... or the file it came from
};

}  // namespace nk
