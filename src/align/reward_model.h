// Scoring with a sequence classifier (ModelConfig::num_labels >= 1): a
// reward model (one label) or an attribute model (SteerLM: one per
// attribute), whose score head reads each sequence's last token.
#pragma once
#include <cstdint>
#include <vector>

#include "model/transformer.h"

namespace nk {

// Each sequence's scores by a sequence classifier (model.config().num_labels
// >= 1): [seqs.size()][num_labels], the score head at the sequence's last
// token. nk::Error for a causal LM (num_labels 0), an empty sequence or one
// longer than max_seq_len. batch: sequences per forward.
std::vector<std::vector<float>> score_sequences(Transformer& model,
                                                const std::vector<std::vector<int32_t>>& seqs,
                                                int64_t batch = 8);

}  // namespace nk
