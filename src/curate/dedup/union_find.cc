#include "curate/dedup/union_find.h"

#include "core/error.h"

namespace nk::curate {

ParallelUnionFind::ParallelUnionFind(uint64_t n) : n_(n) {
  if (n > uint64_t(UINT32_MAX))
    fail("union-find: {} documents is more than the 4294967295 one run can deduplicate", n);
  parent_.reset(new std::atomic<uint32_t>[n]);
  for (uint64_t i = 0; i < n; ++i) parent_[i].store(uint32_t(i), std::memory_order_relaxed);
}

}  // namespace nk::curate
