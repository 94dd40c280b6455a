#include "curate/dedup/dedup_state.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "curate/dedup/dedup_common.h"
#include "curate/dedup/spill.h"

namespace nk::curate {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "nekton-dedup-state";
constexpr int kVersion = 1;

uint64_t size_of(const std::string& path, const DedupState& s) {
  std::error_code ec;
  uint64_t n = fs::file_size(path, ec);
  if (ec) fail("dedup state '{}': cannot read '{}': {}", s.dir, path, ec.message());
  return n;
}

}  // namespace

DedupState open_dedup_state(const std::string& dir, const std::string& stage,
                            const nlohmann::json& params, size_t record_bytes) {
  const std::string head = dir + "/state.json";
  if (!fs::is_directory(dir)) fail("dedup state '{}': no such folder", dir);
  std::ifstream in(head);
  if (!in)
    fail("dedup state '{}': no state.json (not a saved state, or its save did not finish)", dir);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const std::exception& e) {
    fail("dedup state '{}': invalid JSON: {}", head, e.what());
  }
  DedupState s;
  s.dir = dir;
  try {
    if (j.at("format").get<std::string>() != kFormat)
      fail("dedup state '{}': format '{}', expected '{}'", head, j.at("format").dump(), kFormat);
    if (j.at("version").get<int>() != kVersion)
      fail("dedup state '{}': version {}, this build reads version {}", head,
           j.at("version").dump(), kVersion);
    std::string saved = j.at("stage").get<std::string>();
    if (saved != stage)
      fail("dedup state '{}' was saved by {}, and cannot be loaded by {}", dir, saved, stage);
    const nlohmann::json& p = j.at("params");
    for (auto it = params.begin(); it != params.end(); ++it) {
      if (!p.contains(it.key()) || p.at(it.key()) != it.value())
        fail(
            "dedup state '{}' was saved with {} {}, this stage has {}: a state only serves "
            "the same settings",
            dir, it.key(), p.contains(it.key()) ? p.at(it.key()).dump() : "(none)",
            it.value().dump());
    }
    s.documents = j.at("documents").get<uint64_t>();
    s.nodes = j.at("nodes").get<uint64_t>();
    s.records = j.at("records").get<uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    fail("dedup state '{}': {}", head, e.what());
  }
  uint64_t rec = size_of(dir + "/records.bin", s);
  if (rec != s.records * record_bytes)
    fail("dedup state '{}': records.bin has {} bytes, state.json says {} records of {} bytes", dir,
         rec, s.records, record_bytes);
  uint64_t idx = size_of(dir + "/ids.idx", s);
  if (idx != s.nodes * sizeof(uint64_t))
    fail("dedup state '{}': ids.idx has {} bytes, state.json says {} nodes", dir, idx, s.nodes);
  return s;
}

void read_state_records(const DedupState& s, const std::string& file, size_t record_bytes,
                        const std::function<void(const void*, size_t)>& fn) {
  spill_read_records(s.dir + "/" + file, record_bytes, size_t(1) << 16, fn);
}

void read_state_log(const DedupState& s, const std::string& name,
                    const std::function<void(std::string_view)>& fn) {
  const std::string idx = s.dir + "/" + name + ".idx", bin = s.dir + "/" + name + ".bin";
  if (size_of(idx, s) != s.nodes * sizeof(uint64_t))
    fail("dedup state '{}': {} has {} bytes, state.json says {} nodes", s.dir, idx, size_of(idx, s),
         s.nodes);
  const uint64_t data_bytes = size_of(bin, s);
  std::ifstream data(bin, std::ios::binary);
  if (!data) fail("dedup state '{}': cannot open '{}'", s.dir, bin);
  uint64_t start = 0;
  std::string entry;
  spill_read_records(idx, sizeof(uint64_t), size_t(1) << 16, [&](const void* p, size_t n) {
    const uint64_t* ends = static_cast<const uint64_t*>(p);
    for (size_t i = 0; i < n; ++i) {
      if (ends[i] < start || ends[i] > data_bytes)
        fail("dedup state '{}': {} is damaged (entry ends at {}, after {}, in {} bytes)", s.dir,
             idx, ends[i], start, data_bytes);
      entry.resize(ends[i] - start);
      if (!data.read(entry.data(), std::streamsize(entry.size())))
        fail("dedup state '{}': cannot read {}", s.dir, bin);
      fn(entry);
      start = ends[i];
    }
  });
}

void write_dedup_state_header(const std::string& dir, const std::string& stage,
                              const nlohmann::json& params, const DedupState& counts) {
  nlohmann::json j = {
      {"format", kFormat},        {"version", kVersion},           {"stage", stage},
      {"params", params},         {"documents", counts.documents}, {"nodes", counts.nodes},
      {"records", counts.records}};
  write_file_atomic(dir + "/state.json", j.dump(1) + "\n");
}

void NodeSet::add(uint64_t i) {
  NK_CHECK(i < n_, "node {} of {}", i, n_);
  std::atomic_ref<uint64_t>(words_[i >> 6])
      .fetch_or(uint64_t(1) << (i & 63), std::memory_order_relaxed);
}

void NodeSet::rank() {
  before_.resize(words_.size());
  uint64_t c = 0;
  for (size_t w = 0; w < words_.size(); ++w) {
    before_[w] = c;
    c += uint64_t(__builtin_popcountll(words_[w]));
  }
  count_ = c;
}

uint64_t NodeSet::node(uint64_t i) const {
  NK_CHECK(has(i), "document {} is not a node", i);
  uint64_t below = words_[i >> 6] & ((uint64_t(1) << (i & 63)) - 1);
  return before_[i >> 6] + uint64_t(__builtin_popcountll(below));
}

// With save_state: one head file per partition, written by the one thread
// that visits the partition.
std::vector<AppendFile> head_files(const std::string& dir, uint32_t parts) {
  std::vector<AppendFile> f;
  for (uint32_t p = 0; p < parts; ++p) f.emplace_back(fmt::format("{}/heads-{:05d}.bin", dir, p));
  return f;
}

// The ids (and optionally sets) of the nodes, in node order (on rank 0).
void write_node_logs(NodeSet& nodes, const IndexedLog& ids, const IndexedLog* sets,
                     const std::string& dir, uint64_t log_base, const Ranks* ranks) {
  std::vector<uint64_t> want;
  for (uint64_t i = 0; i < nodes.size(); ++i)
    if (nodes.has(i)) want.push_back(i);
  std::vector<std::string> id = log_entries(ids, log_base, want, ranks, false), set;
  if (sets) set = log_entries(*sets, log_base, want, ranks, false);
  if (ranks && ranks->rank() != 0) return;
  IndexedLog out_ids(dir, "ids"), out_sets;
  if (sets) out_sets = IndexedLog(dir, "sets");
  for (size_t k = 0; k < want.size(); ++k) {
    out_ids.append(id[k]);
    if (sets) out_sets.append(set[k]);
  }
  out_ids.flush();
  if (sets) out_sets.flush();
}

void publish_state(const std::string& staged, const std::string& dest) {
  if (dest.empty() || !std::filesystem::exists(staged + "/state.json")) return;
  std::filesystem::path parent = std::filesystem::path(dest).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  // Copied beside DEST first: the work area may be on another file system.
  std::string tmp = temporary_path(dest);
  std::filesystem::remove_all(tmp, ec);
  std::filesystem::copy(staged, tmp, std::filesystem::copy_options::recursive, ec);
  if (ec) fail("save_state '{}': cannot write '{}': {}", dest, tmp, ec.message());
  install_folder(tmp, dest);
  std::filesystem::remove_all(staged, ec);
}

}  // namespace nk::curate
