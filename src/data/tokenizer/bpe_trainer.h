// Training a byte-level BPE vocabulary (GPT-2/tiktoken style) from a corpus:
// pre-tokenize with the vocabulary's pattern, count the distinct pieces in
// parallel, then merge the most frequent adjacent pair until the vocabulary is
// full. Ranks follow merge order, so the result encodes with tiktoken's
// lowest-rank-first algorithm and saves as .tiktoken or encoder.json/vocab.bpe.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer/bpe_vocab.h"

namespace nk {

struct BpeTrainOptions {
  int64_t vocab_size = 8192;  // bytes (256) + merges + specials
  std::string pattern;        // pre-tokenization regex; empty = cl100k's
  std::vector<std::string> specials = {"<|endoftext|>"};
  int64_t min_frequency = 2;  // stop before merging a pair seen fewer times
  int threads = 0;            // counting threads; 0 = the pool's (all cores)
  std::string name = "trained";
};

// Distinct pre-tokenized pieces and how often each occurs.
using PieceCounts = std::unordered_map<std::string, int64_t>;

// Counts the pieces of `texts` split by `pattern` (invalid UTF-8 repaired
// first), in parallel over `threads` workers (0 = all cores).
PieceCounts count_pieces(const std::vector<std::string_view>& texts, const std::string& pattern,
                         int threads);

// The merge loop. Ties between equally frequent pairs go to the pair of lower
// ids (left, then right), so training is deterministic. `on_merge` (optional)
// sees (merges done, merges wanted) for progress.
BpeVocab train_bpe(const PieceCounts& counts, const BpeTrainOptions& opt,
                   const std::function<void(int64_t, int64_t)>& on_merge = {});

// Reads the files (plain, .gz or .dz; at most max_bytes in all, 0 = no limit),
// counts and trains. nk::Error naming a file that cannot be read.
// `on_merge` as train_bpe's.
BpeVocab train_bpe_from_files(const std::vector<std::string>& files, const BpeTrainOptions& opt,
                              int64_t max_bytes = 0,
                              const std::function<void(int64_t, int64_t)>& on_merge = {});

}  // namespace nk
