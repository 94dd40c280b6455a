#include "curate/dedup/dedup.h"

#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>

#include <fmt/format.h>
#include <xxhash.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/parallel.h"
#include "curate/dedup/dedup_common.h"
#include "curate/dedup/union_find.h"
#include "curate/stages.h"

namespace nk::curate {

namespace {

constexpr uint64_t kIndexBits = 40;
constexpr uint64_t kIndexMask = (uint64_t(1) << kIndexBits) - 1;

uint64_t budget_bytes(double memory_mb) {
  return std::max<uint64_t>(uint64_t(memory_mb * 1024 * 1024), 1);
}

// The largest partition one of the finish() threads may hold.
uint64_t per_thread_bytes(double memory_mb) {
  return std::max<uint64_t>(budget_bytes(memory_mb) / uint64_t(std::max(1, num_threads())), 1);
}

const std::string& id_of(const std::vector<uint64_t>& want, const std::vector<std::string>& ids,
                         uint64_t index) {
  auto it = std::lower_bound(want.begin(), want.end(), index);
  NK_CHECK(it != want.end() && *it == index, "id of document {} was not read", index);
  return ids[size_t(it - want.begin())];
}

void check_order(uint64_t first, uint64_t next, const char* stage) {
  NK_CHECK(first == next, "{}: batch starts at document {}, expected {}", stage, first, next);
}

// The settings a saved state must share with the stage that loads it.
nlohmann::json exact_params(const ExactDedupOptions& o) {
  return {{"normalize", o.normalize}};
}

nlohmann::json fuzzy_params(const FuzzyDedupOptions& o) {
  const MinHashParams& m = o.minhash;
  return {{"shingles", m.kind == ShingleKind::kChars ? "chars" : "words"},
          {"ngram", m.ngram},
          {"num_bands", m.num_bands},
          {"rows_per_band", m.rows_per_band},
          {"seed", m.seed},
          {"jaccard_threshold", o.jaccard_threshold}};
}

}  // namespace

void normalize_for_dedup(std::string_view text, std::string& out) {
  bool space = false;
  const uint8_t* s = reinterpret_cast<const uint8_t*>(text.data());
  int32_t n = int32_t(text.size()), i = 0;
  NK_CHECK(text.size() < size_t(INT32_MAX), "document of {} bytes", text.size());
  while (i < n) {
    UChar32 c;
    if (s[i] < 0x80) {
      c = s[i++];
    } else {
      U8_NEXT(s, i, n, c);
      if (c < 0) c = 0xFFFD;
    }
    bool ws = c < 0x80 ? (c == ' ' || (c >= '\t' && c <= '\r')) : u_isUWhiteSpace(c);
    if (ws) {
      space = true;
      continue;
    }
    if (space && !out.empty()) out.push_back(' ');
    space = false;
    if (c < 0x80) {
      out.push_back(c >= 'A' && c <= 'Z' ? char(c + 32) : char(c));
    } else {
      uint8_t buf[4];
      int32_t k = 0;
      U8_APPEND_UNSAFE(buf, k, u_tolower(c));
      out.append(reinterpret_cast<const char*>(buf), size_t(k));
    }
  }
}

// ---------------------------------------------------------------------------
// exact_dedup

void ExactDedup::begin(const std::string& work_dir) {
  dir_ = work_dir + "/exact";
  std::filesystem::create_directories(dir_);
  spill_ = PartitionedSpill<Record>(dir_, opt_.partitions, budget_bytes(opt_.memory_mb));
  ids_ = IndexedLog(dir_, "ids");
  next_ = base_ = seen_ = 0;
  log_base_ = ranks_ && ranks_->rank() != 0 ? start_ : 0;
  if (opt_.load_state.empty()) return;
  DedupState st =
      open_dedup_state(opt_.load_state, "exact_dedup", exact_params(opt_), sizeof(Record));
  base_ = st.nodes;
  seen_ = st.documents;
  // Across ranks rank 0 holds the state's records and ids (its log starts
  // with the nodes); the others' logs start after them.
  if (ranks_ && ranks_->rank() != 0) {
    log_base_ = base_ + start_;
    return;
  }
  read_state_records(st, "records.bin", sizeof(Record), [&](const void* p, size_t n) {
    const Record* r = static_cast<const Record*>(p);
    for (size_t i = 0; i < n; ++i) {
      if (r[i].index >= st.nodes)
        fail("dedup state '{}': records.bin names node {} of {} (damaged)", st.dir, r[i].index,
             st.nodes);
      spill_.add(r[i]);
    }
  });
  read_state_log(st, "ids", [&](std::string_view id) { ids_.append(id); });
}

void ExactDedup::add_batch(uint64_t first, const std::vector<Document>& docs) {
  check_order(first, start_ + next_, "exact_dedup");
  std::vector<Record> recs(docs.size());
  parallel_for_checked(int64_t(docs.size()), 64, [&](int64_t b, int64_t e) {
    thread_local std::string norm;
    for (int64_t i = b; i < e; ++i) {
      const std::string& t = docs[size_t(i)].text;
      XXH128_hash_t h;
      if (opt_.normalize) {
        norm.clear();
        normalize_for_dedup(t, norm);
        h = XXH3_128bits(norm.data(), norm.size());
      } else {
        h = XXH3_128bits(t.data(), t.size());
      }
      recs[size_t(i)] = {h.low64, h.high64, base_ + first + uint64_t(i)};
    }
  });
  for (size_t i = 0; i < docs.size(); ++i) {
    spill_.add(recs[i]);
    ids_.append(docs[i].id);
  }
  next_ += docs.size();
}

std::vector<Removal> ExactDedup::finish(Counters& counts) {
  ids_.flush();
  uint32_t parts = spill_.parts();
  const bool saving = !opt_.save_state.empty();
  const uint64_t n = base_ + (ranks_ ? uint64_t(ranks_->sum(int64_t(next_))) : next_);
  if (saving) {
    nodes_ = std::make_unique<NodeSet>(n);
    heads_ = head_files(dir_, parts);
  }
  // Per partition: (removed index, kept index).
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> found(parts);
  std::vector<int64_t> groups(parts, 0);
  std::vector<uint64_t> split(parts, 0);
  auto group = [&](uint32_t p, std::vector<Record>& r) {
    std::sort(r.begin(), r.end(), [](const Record& x, const Record& y) {
      if (x.lo != y.lo) return x.lo < y.lo;
      if (x.hi != y.hi) return x.hi < y.hi;
      return x.index < y.index;
    });
    for (size_t i = 0; i < r.size();) {
      size_t j = i + 1;
      while (j < r.size() && r[j].lo == r[i].lo && r[j].hi == r[i].hi) {
        found[p].emplace_back(r[j].index, r[i].index);
        ++j;
      }
      groups[p] += j > i + 1;
      if (saving) {
        nodes_->add(r[i].index);
        heads_[p].append(&r[i], sizeof(Record));
      }
      i = j;
    }
  };
  if (ranks_) {
    exchange_partitions<Record>(spill_, *ranks_, group);
  } else {
    uint64_t limit = per_thread_bytes(opt_.memory_mb);
    parallel_for_checked(parts, 1, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p)
        spill_.visit(
            uint32_t(p), limit, [&](std::vector<Record>& r) { group(uint32_t(p), r); },
            &split[size_t(p)]);
    });
  }
  std::vector<std::pair<uint64_t, uint64_t>> all;
  int64_t dup_groups = 0;
  uint64_t spilled = spill_.bytes_spilled();
  for (uint32_t p = 0; p < parts; ++p) {
    all.insert(all.end(), found[p].begin(), found[p].end());
    dup_groups += groups[p];
    spilled += split[p];
  }
  if (ranks_) {
    all = gather_all(*ranks_, all);
    dup_groups = ranks_->sum(dup_groups);
  }
  std::sort(all.begin(), all.end());
  std::vector<uint64_t> want;
  for (auto& [removed, kept] : all) want.push_back(kept);
  std::sort(want.begin(), want.end());
  want.erase(std::unique(want.begin(), want.end()), want.end());
  std::vector<std::string> ids = log_entries(ids_, log_base_, want, ranks_, true);

  // A state's nodes are distinct texts: only this run's documents can be
  // removed (at base_ + their index).
  std::vector<Removal> out;
  out.reserve(all.size());
  for (auto& [removed, kept] : all) {
    NK_CHECK(removed >= base_, "exact_dedup: a loaded state node {} is a duplicate", removed);
    out.push_back(
        {removed - base_, fmt::format("exact duplicate of '{}'", id_of(want, ids, kept))});
  }
  int64_t spill_bytes = int64_t(spilled + ids_.bytes());
  counts["duplicate_groups"] += dup_groups;
  counts["bytes_spilled"] += ranks_ ? ranks_->sum(spill_bytes) : spill_bytes;
  if (base_ > 0) counts["state_documents"] += int64_t(seen_);
  return out;
}

bool ExactDedup::set_ranks(const Ranks* ranks, uint64_t first) {
  ranks_ = ranks;
  start_ = first;
  return true;
}

void ExactDedup::save(const std::string& dir) {
  if (opt_.save_state.empty()) return;
  merge_nodes(*nodes_, ranks_);
  nodes_->rank();
  DedupState st;
  st.records = write_records<Record>(
      heads_, dir, [&](Record& r) { r.index = nodes_->node(r.index); }, ranks_);
  write_node_logs(*nodes_, ids_, nullptr, dir, log_base_, ranks_);
  st.nodes = nodes_->count();
  st.documents = seen_ + (ranks_ ? uint64_t(ranks_->sum(int64_t(next_))) : next_);
  if (ranks_ && ranks_->rank() != 0) return;
  write_dedup_state_header(dir, "exact_dedup", exact_params(opt_), st);
}

void ExactDedup::publish(const std::string& dir) {
  publish_state(dir, opt_.save_state);
}

// ---------------------------------------------------------------------------
// fuzzy_dedup

void FuzzyDedup::begin(const std::string& work_dir) {
  dir_ = work_dir + "/fuzzy";
  std::filesystem::create_directories(dir_);
  spill_ = PartitionedSpill<Record>(dir_, opt_.partitions, budget_bytes(opt_.memory_mb));
  ids_ = IndexedLog(dir_, "ids");
  if (opt_.jaccard_threshold > 0) sets_ = IndexedLog(dir_, "sets");
  next_ = base_ = seen_ = 0;
  log_base_ = ranks_ && ranks_->rank() != 0 ? start_ : 0;
  state_nodes_.clear();
  if (opt_.load_state.empty()) return;
  DedupState st =
      open_dedup_state(opt_.load_state, "fuzzy_dedup", fuzzy_params(opt_), sizeof(Record));
  if (st.nodes > uint64_t(UINT32_MAX))
    fail("dedup state '{}': {} nodes, more than {}", st.dir, st.nodes, uint64_t(UINT32_MAX));
  // Across ranks every rank holds the nodes' clusters (for the union-find of
  // all documents) and rank 0 the records, ids and sets, as ExactDedup.
  const bool holder = !ranks_ || ranks_->rank() == 0;
  if (!holder) log_base_ = st.nodes + start_;
  if (holder)
    read_state_records(st, "records.bin", sizeof(Record), [&](const void* p, size_t n) {
      const Record* r = static_cast<const Record*>(p);
      for (size_t i = 0; i < n; ++i) {
        uint64_t node = r[i].band_doc & kIndexMask, band = r[i].band_doc >> kIndexBits;
        if (node >= st.nodes || band >= uint64_t(opt_.minhash.num_bands))
          fail("dedup state '{}': records.bin names node {} band {} (damaged)", st.dir, node, band);
        spill_.add(r[i]);
      }
    });
  state_nodes_.resize(st.nodes);
  uint64_t at = 0;
  read_state_records(st, "nodes.bin", sizeof(Node), [&](const void* p, size_t n) {
    if (at + n > st.nodes)
      fail("dedup state '{}': nodes.bin holds more than {} nodes", st.dir, st.nodes);
    std::memcpy(state_nodes_.data() + at, p, n * sizeof(Node));
    at += n;
  });
  if (at != st.nodes)
    fail("dedup state '{}': nodes.bin holds {} nodes, state.json says {}", st.dir, at, st.nodes);
  for (uint64_t i = 0; i < st.nodes; ++i)
    if (state_nodes_[i].root > i || (state_nodes_[i].root == i && state_nodes_[i].size == 0))
      fail("dedup state '{}': nodes.bin entry {} is damaged", st.dir, i);
  base_ = st.nodes;
  seen_ = st.documents;
  if (!holder) return;
  read_state_log(st, "ids", [&](std::string_view id) { ids_.append(id); });
  if (opt_.jaccard_threshold > 0)
    read_state_log(st, "sets", [&](std::string_view set) { sets_.append(set.data(), set.size()); });
}

void FuzzyDedup::add_batch(uint64_t first, const std::vector<Document>& docs) {
  check_order(first, start_ + next_, "fuzzy_dedup");
  if (base_ + first + docs.size() > uint64_t(UINT32_MAX))
    fail("fuzzy_dedup: more than {} documents{}", uint64_t(UINT32_MAX),
         base_ ? " (with the loaded state's)" : "");
  const int k = hasher_.num_hashes(), bands = opt_.minhash.num_bands;
  const bool keep_sets = opt_.jaccard_threshold > 0;
  std::vector<uint64_t> buckets(docs.size() * size_t(bands));
  std::vector<std::vector<uint32_t>> sets(keep_sets ? docs.size() : 0);
  parallel_for_checked(int64_t(docs.size()), 16, [&](int64_t b, int64_t e) {
    thread_local std::vector<uint32_t> sh, sig;
    sig.resize(size_t(k));
    for (int64_t i = b; i < e; ++i) {
      sh.clear();
      hasher_.shingles(docs[size_t(i)].text, sh);
      hasher_.signature(sh.data(), sh.size(), sig.data());
      for (int band = 0; band < bands; ++band)
        buckets[size_t(i) * size_t(bands) + size_t(band)] = hasher_.band_hash(sig.data(), band);
      if (keep_sets) {
        sort_unique(sh);
        sets[size_t(i)] = sh;
      }
    }
  });
  for (size_t i = 0; i < docs.size(); ++i) {
    uint64_t index = base_ + first + i;
    for (int band = 0; band < bands; ++band)
      spill_.add(
          {buckets[i * size_t(bands) + size_t(band)], (uint64_t(band) << kIndexBits) | index});
    ids_.append(docs[i].id);
    if (keep_sets) sets_.append(sets[i].data(), sets[i].size() * sizeof(uint32_t));
  }
  next_ += docs.size();
}

std::vector<Removal> FuzzyDedup::finish(Counters& counts) {
  ids_.flush();
  if (opt_.jaccard_threshold > 0) sets_.flush();
  // Across ranks every rank holds the union-find of all documents.
  const uint64_t n = base_ + (ranks_ ? uint64_t(ranks_->sum(int64_t(next_))) : next_);
  uf_ = std::make_unique<ParallelUnionFind>(n);
  ParallelUnionFind& uf = *uf_;
  // A loaded state's clusters, as they were.
  for (uint64_t i = 0; i < base_; ++i) uf.unite(uint32_t(i), state_nodes_[i].root);
  const uint32_t parts = spill_.parts();
  const double threshold = opt_.jaccard_threshold;
  const bool saving = !opt_.save_state.empty();
  if (saving) {
    nodes_ = std::make_unique<NodeSet>(n);
    heads_ = head_files(dir_, parts);
  }
  struct Tally {
    int64_t shared_buckets = 0, candidates = 0, rejected = 0;
    uint64_t split = 0;
  };
  std::vector<Tally> tally(parts);
  uint64_t limit = per_thread_bytes(opt_.memory_mb);
  auto set_of = [&](uint64_t doc) {
    std::string bytes = sets_.get(doc);
    std::vector<uint32_t> s(bytes.size() / sizeof(uint32_t));
    std::memcpy(s.data(), bytes.data(), s.size() * sizeof(uint32_t));
    return s;
  };

  // Across ranks, the documents this rank's unions touched, to share, and the
  // candidate pairs whose Jaccard check needs sets other ranks hold.
  std::vector<std::vector<uint32_t>> touched(ranks_ ? parts : 0);
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> unchecked(ranks_ ? parts : 0);
  auto group = [&](uint32_t p, std::vector<Record>& r) {
    Tally& t = tally[p];
    // (band, bucket, index): a bucket's members are adjacent, lowest first.
    std::sort(r.begin(), r.end(), [](const Record& x, const Record& y) {
      uint64_t bx = x.band_doc >> kIndexBits, by = y.band_doc >> kIndexBits;
      if (bx != by) return bx < by;
      if (x.bucket != y.bucket) return x.bucket < y.bucket;
      return x.band_doc < y.band_doc;
    });
    for (size_t i = 0; i < r.size();) {
      size_t j = i + 1;
      uint64_t band = r[i].band_doc >> kIndexBits;
      while (j < r.size() && r[j].bucket == r[i].bucket && (r[j].band_doc >> kIndexBits) == band)
        ++j;
      uint32_t head = uint32_t(r[i].band_doc & kIndexMask);
      if (saving) {
        nodes_->add(head);
        heads_[p].append(&r[i], sizeof(Record));
      }
      if (j > i + 1) {
        ++t.shared_buckets;
        // Every member is paired with the bucket's first (lowest) one.
        std::vector<uint32_t> head_set;
        if (threshold > 0 && !ranks_) head_set = set_of(head);
        for (size_t m = i + 1; m < j; ++m) {
          uint32_t doc = uint32_t(r[m].band_doc & kIndexMask);
          ++t.candidates;
          if (threshold > 0 && ranks_) {
            unchecked[p].emplace_back(head, doc);
            continue;
          }
          if (threshold > 0) {
            std::vector<uint32_t> s = set_of(doc);
            if (jaccard(head_set.data(), head_set.size(), s.data(), s.size()) < threshold) {
              ++t.rejected;
              continue;
            }
          }
          uf.unite(head, doc);
          if (ranks_) touched[p].insert(touched[p].end(), {head, doc});
        }
      }
      i = j;
    }
  };
  if (ranks_) {
    exchange_partitions<Record>(spill_, *ranks_, group);
    if (threshold > 0) {
      std::vector<std::pair<uint32_t, uint32_t>> pairs;
      for (auto& u : unchecked) pairs.insert(pairs.end(), u.begin(), u.end());
      std::vector<uint8_t> ok = check_jaccard_across(pairs);
      for (size_t i = 0; i < pairs.size(); ++i) {
        if (!ok[i]) {
          ++tally[0].rejected;
          continue;
        }
        uf.unite(pairs[i].first, pairs[i].second);
        touched[0].insert(touched[0].end(), {pairs[i].first, pairs[i].second});
      }
    }
    // Each touched document with its root here; uniting every rank's pairs
    // gives every rank the components of all the unions.
    std::vector<std::pair<uint32_t, uint32_t>> mine;
    for (auto& tp : touched)
      for (uint32_t d : tp) mine.emplace_back(d, uf.find(d));
    for (auto& [d, root] : gather_all(*ranks_, mine)) uf.unite(d, root);
  } else {
    parallel_for_checked(parts, 1, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p)
        spill_.visit(
            uint32_t(p), limit, [&](std::vector<Record>& r) { group(uint32_t(p), r); },
            &tally[size_t(p)].split);
    });
  }

  // Roots are final once every union is done; (index, root) of every
  // non-root, in index order (chunks are contiguous and appended in order).
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(int64_t(n), num_threads()));
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> moved(static_cast<size_t>(chunks));
  parallel_for_checked(chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      uint64_t lo = n * uint64_t(c) / uint64_t(chunks), hi = n * uint64_t(c + 1) / uint64_t(chunks);
      for (uint64_t i = lo; i < hi; ++i) {
        uint32_t r = uf.find(uint32_t(i));
        if (r != i) moved[size_t(c)].emplace_back(uint32_t(i), r);
      }
    }
  });
  std::vector<std::pair<uint32_t, uint32_t>> all;
  for (auto& m : moved) all.insert(all.end(), m.begin(), m.end());
  // A cluster's size: its root's weight plus its members' (1 for a document
  // of this run; for a loaded state's nodes, the documents they stand for).
  std::vector<std::pair<uint64_t, uint64_t>> root_weight;
  root_weight.reserve(all.size());
  for (auto& [doc, root] : all) root_weight.emplace_back(root, weight(doc));
  std::sort(root_weight.begin(), root_weight.end());
  roots_.clear();
  root_sizes_.clear();
  for (size_t i = 0; i < root_weight.size();) {
    size_t j = i;
    uint64_t size = weight(root_weight[i].first);
    for (; j < root_weight.size() && root_weight[j].first == root_weight[i].first; ++j)
      size += root_weight[j].second;
    roots_.push_back(root_weight[i].first);
    root_sizes_.push_back(size);
    i = j;
  }
  // Only this run's documents are removed; a state's nodes were decided
  // before.
  std::vector<uint64_t> want;
  for (auto& [doc, root] : all)
    if (doc >= base_) want.push_back(root);
  std::sort(want.begin(), want.end());
  want.erase(std::unique(want.begin(), want.end()), want.end());
  std::vector<std::string> ids = log_entries(ids_, log_base_, want, ranks_, true);

  std::vector<Removal> out;
  for (auto& [doc, root] : all) {
    if (doc < base_) continue;
    size_t at = size_t(std::lower_bound(want.begin(), want.end(), uint64_t(root)) - want.begin());
    size_t k =
        size_t(std::lower_bound(roots_.begin(), roots_.end(), uint64_t(root)) - roots_.begin());
    out.push_back({doc - base_,
                   fmt::format("near-duplicate of '{}' (cluster of {})", ids[at], root_sizes_[k])});
  }
  Tally sum;
  for (const Tally& t : tally) {
    sum.shared_buckets += t.shared_buckets;
    sum.candidates += t.candidates;
    sum.rejected += t.rejected;
    sum.split += t.split;
  }
  int64_t spilled = int64_t(spill_.bytes_spilled() + sum.split + ids_.bytes() + sets_.bytes());
  if (ranks_) {
    sum.shared_buckets = ranks_->sum(sum.shared_buckets);
    sum.candidates = ranks_->sum(sum.candidates);
    sum.rejected = ranks_->sum(sum.rejected);
    spilled = ranks_->sum(spilled);
  }
  counts["clusters"] += int64_t(want.size());
  counts["shared_buckets"] += sum.shared_buckets;
  counts["candidate_pairs"] += sum.candidates;
  counts["pairs_rejected_by_jaccard"] += sum.rejected;
  counts["bytes_spilled"] += spilled;
  if (base_ > 0) counts["state_documents"] += int64_t(seen_);
  return out;
}

std::vector<uint8_t> FuzzyDedup::check_jaccard_across(
    const std::vector<std::pair<uint32_t, uint32_t>>& pairs) const {
  // Which rank holds which documents' sets: rank q documents [at[q], at[q + 1]).
  const int n = ranks_->size();
  std::vector<uint64_t> at = gather_all(*ranks_, std::vector<uint64_t>{log_base_});
  at.push_back(UINT64_MAX);
  auto owner = [&](uint32_t d) {
    return int(std::upper_bound(at.begin(), at.end() - 1, uint64_t(d)) - at.begin()) - 1;
  };
  // In rounds of kChunk pairs, as many rounds on every rank.
  constexpr size_t kChunk = size_t(1) << 18;
  uint64_t rounds = 0;
  for (uint64_t c :
       gather_all(*ranks_, std::vector<uint64_t>{(pairs.size() + kChunk - 1) / kChunk}))
    rounds = std::max(rounds, c);
  std::vector<uint8_t> ok(pairs.size(), 0);
  for (uint64_t round = 0; round < rounds; ++round) {
    size_t lo = std::min(pairs.size(), size_t(round) * kChunk);
    size_t hi = std::min(pairs.size(), lo + kChunk);
    std::vector<uint32_t> need;
    for (size_t i = lo; i < hi; ++i) need.insert(need.end(), {pairs[i].first, pairs[i].second});
    std::sort(need.begin(), need.end());
    need.erase(std::unique(need.begin(), need.end()), need.end());
    // Ask each owner for its documents' sets: u32 ids, answered as
    // {u32 id, u32 count, count x u32} each.
    std::vector<std::string> ask(static_cast<size_t>(n));
    for (uint32_t d : need)
      ask[size_t(owner(d))].append(reinterpret_cast<const char*>(&d), sizeof(d));
    std::vector<std::string> asked = ranks_->exchange(ask), answer(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) {
      const std::string& req = asked[size_t(q)];
      for (size_t k = 0; k + sizeof(uint32_t) <= req.size(); k += sizeof(uint32_t)) {
        uint32_t d;
        std::memcpy(&d, req.data() + k, sizeof(d));
        std::string set = sets_.get(uint64_t(d) - log_base_);
        uint32_t head[2] = {d, uint32_t(set.size() / sizeof(uint32_t))};
        answer[size_t(q)].append(reinterpret_cast<const char*>(head), sizeof(head));
        answer[size_t(q)] += set;
      }
    }
    std::vector<std::vector<uint32_t>> sets(need.size());
    for (const std::string& a : ranks_->exchange(answer)) {
      for (size_t k = 0; k < a.size();) {
        uint32_t head[2];
        std::memcpy(head, a.data() + k, sizeof(head));
        k += sizeof(head);
        size_t slot = size_t(std::lower_bound(need.begin(), need.end(), head[0]) - need.begin());
        sets[slot].resize(head[1]);
        std::memcpy(sets[slot].data(), a.data() + k, head[1] * sizeof(uint32_t));
        k += head[1] * sizeof(uint32_t);
      }
    }
    auto set_of = [&](uint32_t d) -> const std::vector<uint32_t>& {
      return sets[size_t(std::lower_bound(need.begin(), need.end(), d) - need.begin())];
    };
    for (size_t i = lo; i < hi; ++i) {
      const auto &a = set_of(pairs[i].first), &b = set_of(pairs[i].second);
      ok[i] = jaccard(a.data(), a.size(), b.data(), b.size()) >= opt_.jaccard_threshold;
    }
  }
  return ok;
}

bool FuzzyDedup::set_ranks(const Ranks* ranks, uint64_t first) {
  ranks_ = ranks;
  start_ = first;
  return true;
}

void FuzzyDedup::save(const std::string& dir) {
  if (opt_.save_state.empty()) return;
  NodeSet& nodes = *nodes_;
  merge_nodes(nodes, ranks_);
  nodes.rank();
  DedupState st;
  st.records = write_records<Record>(
      heads_, dir,
      [&](Record& r) {
        r.band_doc = (r.band_doc & ~kIndexMask) | nodes.node(r.band_doc & kIndexMask);
      },
      ranks_);
  write_node_logs(nodes, ids_, opt_.jaccard_threshold > 0 ? &sets_ : nullptr, dir, log_base_,
                  ranks_);
  st.documents = seen_ + (ranks_ ? uint64_t(ranks_->sum(int64_t(next_))) : next_);
  if (ranks_ && ranks_->rank() != 0) return;
  // Every node's root is a node: a cluster's root is the lowest member of
  // some bucket (the one that joined it to the rest), or the node itself.
  AppendFile out(dir + "/nodes.bin");
  for (uint64_t i = 0; i < nodes.size(); ++i) {
    if (!nodes.has(i)) continue;
    uint32_t root = uf_->find(uint32_t(i));
    Node node{uint32_t(nodes.node(root)), 0};
    if (root == i) {
      auto it = std::lower_bound(roots_.begin(), roots_.end(), i);
      node.size = uint32_t(it != roots_.end() && *it == i ? root_sizes_[size_t(it - roots_.begin())]
                                                          : weight(i));
    }
    out.append(&node, sizeof(node));
  }
  out.flush();
  st.nodes = nodes.count();
  write_dedup_state_header(dir, "fuzzy_dedup", fuzzy_params(opt_), st);
}

void FuzzyDedup::publish(const std::string& dir) {
  publish_state(dir, opt_.save_state);
}

// ---------------------------------------------------------------------------
// configuration and registration

namespace {

void read_memory_mb(StageConfig& c, double& mb) {
  c.bind("memory_mb", mb, "records held in memory before spilling to disk (MB)");
  if (!(mb > 0)) c.fail_key("memory_mb", fmt::format("must be > 0, got {}", mb));
}

void read_partitions(StageConfig& c, uint32_t& p) {
  c.bind("partitions", p, "disk partitions of spilled records");
  if (p < 1 || p > 65536) c.fail_key("partitions", fmt::format("must be 1..65536, got {}", p));
}

void read_state_keys(StageConfig& c, std::string& load, std::string& save) {
  c.bind("load_state", load,
         "a state folder an earlier run saved: documents duplicating what it has seen are removed");
  c.bind("save_state", save,
         "folder to save this stage's state in at the end of the run (all documents seen, "
         "the loaded state's too)");
  if (!load.empty() && !std::filesystem::is_directory(load))
    c.fail_key("load_state", fmt::format("no such folder '{}'", load));
}

// Binds an int key that must be in 1..max; whether it was given.
bool read_positive(StageConfig& c, const std::string& key, int& field, int max,
                   const std::string& doc) {
  bool given = c.bind(key, field, doc);
  if (field < 1 || field > max) c.fail_key(key, fmt::format("must be 1..{}, got {}", max, field));
  return given;
}

}  // namespace

ExactDedupOptions exact_dedup_options(StageConfig& c) {
  ExactDedupOptions o;
  c.bind("normalize", o.normalize, "compare texts with case and whitespace normalised");
  read_memory_mb(c, o.memory_mb);
  read_partitions(c, o.partitions);
  read_state_keys(c, o.load_state, o.save_state);
  return o;
}

FuzzyDedupOptions fuzzy_dedup_options(StageConfig& c) {
  FuzzyDedupOptions o;
  std::string preset = "nemo";
  c.bind("preset", preset, "MinHash settings the other keys change: nemo or fineweb");
  if (!minhash_preset(preset, o.minhash))
    c.fail_key("preset", fmt::format("unknown preset '{}' (known: nemo, fineweb)", preset));
  if (c.has("char_ngrams") && c.has("word_ngrams"))
    c.fail_key("word_ngrams", "give either char_ngrams or word_ngrams, not both");
  int char_ngrams = 24, word_ngrams = 5;
  if (read_positive(c, "char_ngrams", char_ngrams, 4096, "shingles of this many code points")) {
    o.minhash.kind = ShingleKind::kChars;
    o.minhash.ngram = char_ngrams;
  }
  if (read_positive(c, "word_ngrams", word_ngrams, 1024, "shingles of this many words")) {
    o.minhash.kind = ShingleKind::kWords;
    o.minhash.ngram = word_ngrams;
  }
  read_positive(c, "num_bands", o.minhash.num_bands, 1 << 16, "LSH bands");
  read_positive(c, "rows_per_band", o.minhash.rows_per_band, 1024, "MinHash values per band");
  if (o.minhash.num_hashes() > 8192)
    c.fail_key("rows_per_band", fmt::format("num_bands x rows_per_band = {} is more than 8192",
                                            o.minhash.num_hashes()));
  c.bind("seed", o.minhash.seed, "seed of the MinHash functions");
  c.bind("jaccard_threshold", o.jaccard_threshold,
         "> 0: a candidate pair is a duplicate only at this Jaccard similarity or more");
  if (!(o.jaccard_threshold >= 0 && o.jaccard_threshold <= 1))
    c.fail_key("jaccard_threshold", fmt::format("must be in [0, 1], got {}", o.jaccard_threshold));
  read_memory_mb(c, o.memory_mb);
  read_partitions(c, o.partitions);
  read_state_keys(c, o.load_state, o.save_state);
  return o;
}

void register_dedup_stages(StageRegistry& r) {
  r.add({"exact_dedup",
         "remove documents whose (normalized) text equals an earlier one's; keys: normalize "
         "(true), memory_mb (1024), partitions (64), load_state, save_state",
         nullptr, [](StageConfig& c) -> std::unique_ptr<GlobalStage> {
           return std::make_unique<ExactDedup>(exact_dedup_options(c));
         }});
  r.add({"fuzzy_dedup",
         "remove near-duplicates by MinHash LSH; keys: preset (nemo|fineweb), char_ngrams, "
         "word_ngrams, num_bands, rows_per_band, seed, jaccard_threshold (0 = off), memory_mb "
         "(1024), partitions (64), load_state, save_state",
         nullptr, [](StageConfig& c) -> std::unique_ptr<GlobalStage> {
           return std::make_unique<FuzzyDedup>(fuzzy_dedup_options(c));
         }});
}

}  // namespace nk::curate
