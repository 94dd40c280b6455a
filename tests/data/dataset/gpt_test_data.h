// Small indexed datasets for the GPT dataset, blending and loader tests.
#pragma once
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/dataset/indexed_dataset.h"

namespace nk::test {

// `n_docs` documents of 0..max_len-1 tokens (a few of one to three sequences)
// whose tokens are their global positions in the .bin plus `base`, so every
// token of the data is unique and tells where it came from. Returns the prefix.
inline std::string write_counting_dataset(const std::string& prefix, int n_docs, int max_len,
                                          uint64_t seed, int32_t base = 0) {
  Rng rng(seed);
  IndexedDatasetWriter w(prefix, IndexDType::I32);
  int32_t next = base;
  for (int d = 0; d < n_docs; ++d) {
    int n_seq = rng.below(5) == 0 ? 1 + int(rng.below(3)) : 1;
    for (int s = 0; s < n_seq; ++s) {
      std::vector<int32_t> seq(rng.below(uint64_t(max_len)));
      for (auto& t : seq) t = next++;
      w.add_sequence(seq);
    }
    w.end_document();
  }
  w.finish();
  return prefix;
}

// Random ids below `vocab`, `n_docs` documents of 1..max_len tokens, u16 on disk.
inline std::string write_random_dataset(const std::string& prefix, int n_docs, int max_len,
                                        int32_t vocab, uint64_t seed) {
  Rng rng(seed);
  IndexedDatasetWriter w(prefix, token_dtype_for_vocab(vocab));
  for (int d = 0; d < n_docs; ++d) {
    std::vector<int32_t> doc(1 + rng.below(uint64_t(max_len)));
    for (auto& t : doc) t = int32_t(rng.below(uint64_t(vocab)));
    w.add_document(doc);
  }
  w.finish();
  return prefix;
}

}  // namespace nk::test
