// Exact and fuzzy (MinHash LSH) deduplication: the GlobalStages exact_dedup
// and fuzzy_dedup. Both keep the lowest-index document of each group and
// remove the rest, and both hold only small fixed records per document in
// memory up to `memory_mb`, spilling the rest under the work folder:
//
//   exact_dedup  exact/part-NNNNN.bin  {u64 hash lo, u64 hash hi, u64 index}
//                exact/ids.bin, ids.idx  document ids in index order
//   fuzzy_dedup  fuzzy/part-NNNNN.bin  {u64 bucket, u64 band << 40 | index}
//                fuzzy/ids.bin, ids.idx
//                fuzzy/sets.bin, sets.idx  per document its sorted distinct
//                  32-bit shingle hashes (only with jaccard_threshold > 0)
//
// (see spill.h for the .bin/.idx and partition layouts). Partitions go by
// hash, so every group of equal hashes (exact) or every LSH bucket (fuzzy) is
// in one partition; finish() reads partitions on all threads, each at most
// memory_mb / threads bytes (a larger one is split again by other hash bits).
//
// Incremental runs (dedup_state.h): `load_state: DIR` numbers the state's
// nodes 0 .. M-1 before this run's documents (M + i internally, i in the
// runner's order), so a node is always the lowest of its group and the same
// finish() decides; removals are reported for this run's documents alone.
// `save_state: DIR` writes the nodes of everything seen, old and new.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "curate/dedup/dedup_state.h"
#include "curate/dedup/minhash.h"
#include "curate/dedup/spill.h"
#include "curate/dedup/union_find.h"
#include "curate/document.h"
#include "curate/stage_config.h"

namespace nk::curate {

// Lowercased (Unicode simple case mapping), runs of white space collapsed to
// one ' ', trimmed: what exact_dedup with normalize: true compares.
void normalize_for_dedup(std::string_view text, std::string& out);

struct ExactDedupOptions {
  bool normalize = true;
  double memory_mb = 1024;  // records held in memory before spilling
  uint32_t partitions = 64;
  std::string load_state, save_state;  // folders (dedup_state.h); empty: none
};

class ExactDedup : public GlobalStage {
 public:
  explicit ExactDedup(ExactDedupOptions o) : opt_(o) {}
  void begin(const std::string& work_dir) override;
  void add_batch(uint64_t first, const std::vector<Document>& docs) override;
  std::vector<Removal> finish(Counters& counts) override;
  bool set_ranks(const Ranks* ranks, uint64_t first) override;
  void save(const std::string& dir) override;
  void publish(const std::string& dir) override;

  struct Record {
    uint64_t lo, hi, index;
    uint64_t partition_key() const { return lo; }
  };

 private:
  ExactDedupOptions opt_;
  std::string dir_;
  const Ranks* ranks_ = nullptr;  // across ranks: this one's documents start at start_
  uint64_t start_ = 0;
  uint64_t log_base_ = 0;  // the internal index of ids_'s first entry
  uint64_t base_ = 0;      // nodes of the loaded state (they come first)
  uint64_t seen_ = 0;      // documents the loaded state has seen
  uint64_t next_ = 0;      // this run's documents so far
  PartitionedSpill<Record> spill_;
  IndexedLog ids_;
  std::unique_ptr<NodeSet> nodes_;  // with save_state: the first of each group
  std::vector<AppendFile> heads_;   // with save_state: per partition, those records
};

struct FuzzyDedupOptions {
  MinHashParams minhash;         // preset nemo unless configured
  double jaccard_threshold = 0;  // > 0: verify candidate pairs exactly
  double memory_mb = 1024;
  uint32_t partitions = 64;
  std::string load_state, save_state;  // folders (dedup_state.h); empty: none
};

class FuzzyDedup : public GlobalStage {
 public:
  explicit FuzzyDedup(FuzzyDedupOptions o) : opt_(o), hasher_(o.minhash) {}
  void begin(const std::string& work_dir) override;
  void add_batch(uint64_t first, const std::vector<Document>& docs) override;
  std::vector<Removal> finish(Counters& counts) override;
  bool set_ranks(const Ranks* ranks, uint64_t first) override;
  void save(const std::string& dir) override;
  void publish(const std::string& dir) override;

  // One document's bucket in one band; 40 bits of index, 24 of band.
  struct Record {
    uint64_t bucket, band_doc;
    uint64_t partition_key() const { return bucket; }
  };
  // A loaded state's node: its cluster's root node, and for a root the
  // cluster's size (0 for others).
  struct Node {
    uint32_t root, size;
  };

 private:
  // Across ranks: whether each candidate pair passes jaccard_threshold, the
  // sets fetched from the ranks holding them (collective).
  std::vector<uint8_t> check_jaccard_across(
      const std::vector<std::pair<uint32_t, uint32_t>>& pairs) const;
  // How many documents x stands for in a cluster's size: a state's root its
  // whole cluster seen before, another state node none (its root counts it).
  uint64_t weight(uint64_t x) const {
    if (x >= base_) return 1;
    return state_nodes_[x].root == x ? state_nodes_[x].size : 0;
  }

  FuzzyDedupOptions opt_;
  MinHasher hasher_;
  std::string dir_;
  const Ranks* ranks_ = nullptr;  // as ExactDedup's
  uint64_t start_ = 0, log_base_ = 0;
  uint64_t base_ = 0, seen_ = 0, next_ = 0;
  PartitionedSpill<Record> spill_;
  IndexedLog ids_, sets_;
  std::vector<Node> state_nodes_;  // of the loaded state
  // After finish(), for save(): the clusters (root, size) and the heads.
  std::unique_ptr<ParallelUnionFind> uf_;
  std::vector<uint64_t> roots_;
  std::vector<uint64_t> root_sizes_;
  std::unique_ptr<NodeSet> nodes_;
  std::vector<AppendFile> heads_;
};

// Options from a pipeline stage's keys (nk::Error naming a bad key).
ExactDedupOptions exact_dedup_options(StageConfig& c);
FuzzyDedupOptions fuzzy_dedup_options(StageConfig& c);

}  // namespace nk::curate
