// The index arithmetic of Megatron-Core's GPTDataset (gpt_dataset.py and
// helpers.cpp), as plain functions over vectors. Samples overlap by one token
// ("add_extra_token"): sample j is tokens [j*T, j*T + T] of the documents
// concatenated in document-index order, so T+1 tokens give T inputs and T targets.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"

namespace nk {

enum class DataSplit { Train = 0, Valid = 1, Test = 2 };
const char* split_name(DataSplit s);  // "train", "valid", "test"

// "969,30,1" -> {0.969, 0.03, 0.001}: one to three non-negative numbers (missing
// parts are 0, as in Megatron) with a positive sum. nk::Error quoting the text.
std::array<double, 3> parse_split(const std::string& text);

// Megatron's split boundaries over n documents: b[0] = 0, b[s+1] = b[s] +
// round(fraction[s] * n) (ties to even), then shifted so b[3] = n (clamped to
// stay within [0, n] and ordered). Split s is the documents [b[s], b[s+1]).
std::array<int64_t, 4> split_boundaries(const std::array<double, 3>& fractions, int64_t n);

// Uniform integer in [0, n) without modulo bias (rejection sampling), n > 0.
uint64_t uniform_below(Rng& rng, uint64_t n);
// Fisher-Yates: for i = n-1 down to 1 swap a[i] with a[uniform_below(i+1)].
void shuffle_in_place(std::vector<int64_t>& a, Rng& rng);

// Samples available from `num_epochs` epochs of `tokens_per_epoch` tokens:
// (num_epochs * tokens_per_epoch - 1) / seq_len (the partial last sample dropped).
int64_t samples_in_epochs(int64_t num_epochs, int64_t tokens_per_epoch, int64_t seq_len);
// The fewest epochs giving at least num_samples samples.
int64_t num_epochs_for(int64_t tokens_per_epoch, int64_t seq_len, int64_t num_samples);
// Megatron's rule: with more than one epoch, the last epoch is shuffled on its
// own when fewer than 80% of its samples are needed (so the samples actually
// read are not drawn unevenly from a partly-used epoch).
bool use_separate_final_epoch(int64_t num_epochs, int64_t tokens_per_epoch, int64_t seq_len,
                              int64_t num_samples);

// Documents [begin, end) tiled num_epochs times and shuffled; with
// separate_final_epoch the first num_epochs-1 epochs are shuffled together and
// the last on its own after them (one Rng stream, in that order).
std::vector<int64_t> build_document_index(int64_t begin, int64_t end, int64_t num_epochs,
                                          bool separate_final_epoch, Rng& rng);

// (num_samples + 1) pairs, flattened: [2j] is the position in document_index
// where sample j starts, [2j+1] the token offset in that document. Sample j
// ends at pair j+1 inclusive of that token. doc_lengths[d]: tokens of document d.
std::vector<int64_t> build_sample_index(const std::vector<int64_t>& doc_lengths,
                                        const std::vector<int64_t>& document_index, int64_t seq_len,
                                        int64_t num_samples);

// A permutation of [0, total): [0, num_first) shuffled, then [num_first, total)
// shuffled among themselves after them.
std::vector<int64_t> build_shuffle_index(int64_t num_first, int64_t total, Rng& rng);

}  // namespace nk
