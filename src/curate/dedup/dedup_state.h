// The saved state of a dedup stage: `save_state: DIR` writes it at the end of
// a run, and a later run given `load_state: DIR` deduplicates its documents
// against everything the state has seen, without reading those documents
// again, so that a corpus can grow crawl by crawl. What a run with the state
// removes is what one run over all the old documents followed by the new ones
// removes from the new ones (tests/curate/dedup/dedup_state_test.cc).
//
// A state keeps only its *nodes*: the documents a new one can still be
// matched against. exact_dedup's nodes are the first document of each
// distinct text; fuzzy_dedup's are the lowest document of each LSH bucket
// (every cluster's root is one). Nodes are numbered in document order.
//
//   DIR/state.json  {"format": "nekton-dedup-state", "version": 1,
//                    "stage": "exact_dedup" | "fuzzy_dedup",
//                    "params": {...settings that decide the result},
//                    "documents": N seen in all runs, "nodes": M, "records": R}
//   DIR/records.bin R records, the stage's own Record type, indexed by node:
//                   exact {u64 hash lo, u64 hash hi, u64 node},
//                   fuzzy {u64 bucket, u64 band << 40 | node}, one per bucket
//   DIR/ids.bin, ids.idx    each node's document id (spill.h's IndexedLog)
//   DIR/nodes.bin   fuzzy: per node {u32 root node, u32 cluster size}; the
//                   size counts every document of the cluster seen so far
//   DIR/sets.bin, sets.idx  fuzzy with jaccard_threshold > 0: each node's
//                   sorted distinct shingle hashes (u32)
//
// state.json is written last; the folder is put in place whole
// (install_folder) once the run's output is complete, so DIR is always a
// complete state or the previous one.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "curate/dedup/spill.h"
#include "curate/ranks.h"

namespace nk::curate {

struct DedupState {
  std::string dir;
  uint64_t documents = 0, nodes = 0, records = 0;
};

// Opens DIR's state and checks it was written by `stage` with the same
// `params`, and that its files hold what state.json says. nk::Error naming
// the folder, the file or the setting that differs.
DedupState open_dedup_state(const std::string& dir, const std::string& stage,
                            const nlohmann::json& params, size_t record_bytes);

// fn(records, count) over FILE's fixed-size records, in order.
void read_state_records(const DedupState& s, const std::string& file, size_t record_bytes,
                        const std::function<void(const void*, size_t)>& fn);

// fn(entry) over the IndexedLog NAME (ids, sets), which must hold s.nodes
// entries; nk::Error naming the file when it does not.
void read_state_log(const DedupState& s, const std::string& name,
                    const std::function<void(std::string_view)>& fn);

// Writes DIR/state.json (after every other file of the state).
void write_dedup_state_header(const std::string& dir, const std::string& stage,
                              const nlohmann::json& params, const DedupState& counts);

// A set of node indices over documents 0 .. n-1, and each member's rank
// (its node number): node numbers keep document order.
class NodeSet {
 public:
  explicit NodeSet(uint64_t n) : words_((n + 63) / 64), n_(n) {}
  void add(uint64_t i);  // thread-safe
  bool has(uint64_t i) const { return (words_[i >> 6] >> (i & 63)) & 1; }
  void rank();                      // after the last add(): fills the ranks
  uint64_t node(uint64_t i) const;  // rank of a member (after rank())
  uint64_t count() const { return count_; }
  uint64_t size() const { return n_; }
  // The membership bits, 64 documents a word (to merge the sets of ranks).
  std::vector<uint64_t>& words() { return words_; }

 private:
  std::vector<uint64_t> words_;
  std::vector<uint64_t> before_;  // members in the words before each word
  uint64_t n_ = 0, count_ = 0;
};

// With save_state: one head file per partition, written by the one thread
// that visits the partition.
std::vector<AppendFile> head_files(const std::string& dir, uint32_t parts);

// The heads, renumbered as nodes, into DIR/records.bin; how many (0 on
// ranks other than 0: across ranks every rank sends its partitions' heads to
// rank 0, which writes them in partition order, as one process does).
template <class R, class Remap>
uint64_t write_records(std::vector<AppendFile>& heads, const std::string& dir, Remap remap,
                       const Ranks* ranks) {
  if (ranks) {
    std::string mine;
    for (AppendFile& h : heads) {
      h.flush();
      if (h.size() == 0) continue;
      spill_read_records(h.path(), sizeof(R), size_t(1) << 16, [&](const void* p, size_t k) {
        mine.append(static_cast<const char*>(p), k * sizeof(R));
      });
    }
    std::vector<std::string> send(size_t(ranks->size()));
    send[0] = std::move(mine);
    std::vector<std::string> got = ranks->exchange(send);
    if (ranks->rank() != 0) return 0;
    std::vector<R> all;
    for (const std::string& g : got) {
      size_t at = all.size();
      all.resize(at + g.size() / sizeof(R));
      std::memcpy(static_cast<void*>(all.data() + at), g.data(), g.size());
    }
    const uint32_t parts = uint32_t(heads.size());
    std::stable_sort(all.begin(), all.end(), [&](const R& a, const R& b) {
      return partition_of(a.partition_key(), 0, parts) < partition_of(b.partition_key(), 0, parts);
    });
    AppendFile out(dir + "/records.bin");
    for (R& r : all) {
      remap(r);
      out.append(&r, sizeof(R));
    }
    out.flush();
    return all.size();
  }
  AppendFile out(dir + "/records.bin");
  uint64_t n = 0;
  for (AppendFile& h : heads) {
    h.flush();
    if (h.size() == 0) continue;
    spill_read_records(h.path(), sizeof(R), size_t(1) << 16, [&](const void* p, size_t k) {
      const R* r = static_cast<const R*>(p);
      for (size_t i = 0; i < k; ++i) {
        R x = r[i];
        remap(x);
        out.append(&x, sizeof(R));
      }
      n += k;
    });
  }
  out.flush();
  return n;
}

// The ids (and optionally sets) of the nodes, in node order (on rank 0).
void write_node_logs(NodeSet& nodes, const IndexedLog& ids, const IndexedLog* sets,
                     const std::string& dir, uint64_t log_base, const Ranks* ranks);

void publish_state(const std::string& staged, const std::string& dest);

}  // namespace nk::curate
