// What exact_dedup and fuzzy_dedup share beyond their own records: a
// parallel loop that carries exceptions out, ids read back from a log, and,
// across ranks (curate/ranks.h), the exchange of spill partitions between
// ranks and the gathers of their results.
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "curate/dedup/dedup_state.h"
#include "curate/dedup/spill.h"
#include "curate/ranks.h"

namespace nk::curate {

// nk::parallel_for, with an exception thrown inside a chunk carried out of the
// OpenMP region and rethrown here.
void parallel_for_checked(int64_t n, int64_t grain,
                          const std::function<void(int64_t, int64_t)>& fn);

// The ids of documents `want` (sorted, distinct), read back from the log.
std::vector<std::string> read_ids(const IndexedLog& log, const std::vector<uint64_t>& want);

// Across ranks: partition p of every rank's spill goes whole to rank
// p % size, one partition per rank per round (so each rank holds about one
// partition at a time); fn(p, records) runs on its owner.
template <class R>
void exchange_partitions(const PartitionedSpill<R>& spill, const Ranks& ranks,
                         const std::function<void(uint32_t, std::vector<R>&)>& fn) {
  const uint32_t parts = spill.parts(), n = uint32_t(ranks.size());
  for (uint32_t r0 = 0; r0 < parts; r0 += n) {
    std::vector<std::string> send(n);
    for (uint32_t j = 0; j < n && r0 + j < parts; ++j) {
      uint64_t unused = 0;
      spill.visit(
          r0 + j, UINT64_MAX,
          [&](std::vector<R>& recs) {
            send[j].append(reinterpret_cast<const char*>(recs.data()), recs.size() * sizeof(R));
          },
          &unused);
    }
    std::vector<std::string> got = ranks.exchange(send);
    const uint32_t mine = r0 + uint32_t(ranks.rank());
    if (mine >= parts) continue;
    std::vector<R> all;
    for (const std::string& g : got) {
      size_t at = all.size();
      all.resize(at + g.size() / sizeof(R));
      std::memcpy(all.data() + at, g.data(), g.size());
    }
    fn(mine, all);
  }
}

// Every rank's trivially copyable items, in rank order.
template <class T>
std::vector<T> gather_all(const Ranks& ranks, const std::vector<T>& mine) {
  std::string bytes(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(T));
  std::vector<T> out;
  for (const std::string& g : ranks.all_gather(bytes)) {
    size_t at = out.size();
    out.resize(at + g.size() / sizeof(T));
    std::memcpy(static_cast<void*>(out.data() + at), g.data(), g.size());
  }
  return out;
}

// Entries `want` (sorted, distinct internal indices) of the logs of every
// rank, each rank's log holding [log_base, log_base + count): on every rank
// (`everywhere`), or on rank 0 alone (empty elsewhere). Alone: read from
// `log` (log_base 0).
std::vector<std::string> log_entries(const IndexedLog& log, uint64_t log_base,
                                     const std::vector<uint64_t>& want, const Ranks* ranks,
                                     bool everywhere);

// Across ranks: every rank's nodes in each rank's set.
void merge_nodes(NodeSet& nodes, const Ranks* ranks);

}  // namespace nk::curate
