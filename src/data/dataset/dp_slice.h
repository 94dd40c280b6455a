// Which samples each data-parallel rank reads (Megatron's pretraining sampler).
//
// One optimizer step consumes a global batch of G = dp × B × accum samples
// starting at sample `first` (the consumed-sample count): one process reads
// them in order as micro-batches of B. With dp ranks, the k-th group of dp
// consecutive micro-batches goes one to each rank: rank r's local micro-batch
// m holds the samples of the single process's micro-batch m·dp + r,
//   [first + (m·dp + r)·B, first + (m·dp + r + 1)·B).
// Together the ranks read exactly the G samples one process would, each
// micro-batch contiguous, and a step ends at first + G on every rank.
#pragma once
#include <cstdint>

namespace nk {

inline int64_t dp_micro_batch_first_sample(int64_t first, int64_t m, int64_t dp, int64_t rank,
                                           int64_t micro_batch) {
  return first + (m * dp + rank) * micro_batch;
}

}  // namespace nk
