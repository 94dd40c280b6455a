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

#include "data/bpe_vocab.h"

namespace nk {

struct BpeTrainOptions {
  int64_t vocab_size = 8192;  // bytes (256) + merges + specials
  std::string pattern;        // pre-tokenization regex; empty = GPT-2's
  std::vector<std::string> specials = {"<|endoftext|>"};
  int64_t min_frequency = 2;  // stop before merging a pair seen fewer times
  int threads = 0;            // counting threads; 0 = all cores
  std::string name = "trained";
};

// Distinct pre-tokenized pieces and how often each occurs.
using PieceCounts = std::unordered_map<std::string, int64_t>;

// The merge loop. Ties between equally frequent pairs go to the pair of lower
// ids (left, then right), so training is deterministic. `on_merge` (optional)
// sees (merges done, merges wanted) for progress.
BpeVocab train_bpe(const PieceCounts& counts, const BpeTrainOptions& opt,
                   const std::function<void(int64_t, int64_t)>& on_merge = {});

}  // namespace nk
