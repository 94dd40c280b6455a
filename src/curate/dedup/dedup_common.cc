#include "curate/dedup/dedup_common.h"

#include <algorithm>
#include <exception>
#include <mutex>

#include "core/error.h"
#include "core/parallel.h"

namespace nk::curate {

// nk::parallel_for, with an exception thrown inside a chunk carried out of the
// OpenMP region and rethrown here.
void parallel_for_checked(int64_t n, int64_t grain,
                          const std::function<void(int64_t, int64_t)>& fn) {
  std::mutex mu;
  std::exception_ptr err;
  parallel_for(n, grain, [&](int64_t b, int64_t e) {
    try {
      fn(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!err) err = std::current_exception();
    }
  });
  if (err) std::rethrow_exception(err);
}

// The ids of documents `want` (sorted, distinct), read back from the log.
std::vector<std::string> read_ids(const IndexedLog& log, const std::vector<uint64_t>& want) {
  std::vector<std::string> ids(want.size());
  parallel_for_checked(int64_t(want.size()), 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) ids[size_t(i)] = log.get(want[size_t(i)]);
  });
  return ids;
}

// Entries `want` (sorted, distinct internal indices) of the logs of every
// rank, each rank's log holding [log_base, log_base + count): on every rank
// (`everywhere`), or on rank 0 alone (empty elsewhere). Alone: read from
// `log` (log_base 0).
std::vector<std::string> log_entries(const IndexedLog& log, uint64_t log_base,
                                     const std::vector<uint64_t>& want, const Ranks* ranks,
                                     bool everywhere) {
  if (!ranks) {
    NK_CHECK(log_base == 0, "log entries from {} without ranks", log_base);
    return read_ids(log, want);
  }
  auto lo = std::lower_bound(want.begin(), want.end(), log_base);
  auto hi = std::lower_bound(want.begin(), want.end(), log_base + log.count());
  std::vector<uint64_t> local;
  for (auto it = lo; it != hi; ++it) local.push_back(*it - log_base);
  std::vector<std::string> mine = read_ids(log, local);
  // {u64 index, u64 length, bytes} each.
  std::string bytes;
  for (size_t i = 0; i < mine.size(); ++i) {
    uint64_t head[2] = {local[i] + log_base, mine[i].size()};
    bytes.append(reinterpret_cast<const char*>(head), sizeof(head));
    bytes += mine[i];
  }
  std::vector<std::string> got;
  if (everywhere) {
    got = ranks->all_gather(bytes);
  } else {
    std::vector<std::string> send(size_t(ranks->size()));
    send[0] = std::move(bytes);
    got = ranks->exchange(send);
    if (ranks->rank() != 0) return {};
  }
  std::vector<std::string> out(want.size());
  for (const std::string& g : got)
    for (size_t at = 0; at < g.size();) {
      uint64_t head[2];
      std::memcpy(head, g.data() + at, sizeof(head));
      at += sizeof(head);
      auto it = std::lower_bound(want.begin(), want.end(), head[0]);
      NK_CHECK(it != want.end() && *it == head[0], "entry {} was not asked for", head[0]);
      out[size_t(it - want.begin())] = g.substr(at, head[1]);
      at += head[1];
    }
  return out;
}

// Across ranks: every rank's nodes in each rank's set.
void merge_nodes(NodeSet& nodes, const Ranks* ranks) {
  if (!ranks) return;
  std::vector<uint64_t>& w = nodes.words();
  std::vector<uint64_t> all = gather_all(*ranks, w);
  for (size_t i = 0; i < all.size(); ++i) w[i % w.size()] |= all[i];
}

}  // namespace nk::curate
