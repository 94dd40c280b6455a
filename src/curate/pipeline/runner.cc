#include "curate/pipeline/runner.h"

#include <xxhash.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "core/output_lock.h"
#include "core/parallel.h"
#include "curate/pipeline/record.h"
#include "curate/stages.h"
#include "data/preprocess.h"
#include "data/utf8.h"

namespace nk::curate {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct DocStageEntry {
  std::string name, type;
  std::unique_ptr<DocStage> stage;
};

struct Segment {
  std::string global_name, global_type;  // empty for segment 0
  std::unique_ptr<GlobalStage> global;
  std::vector<DocStageEntry> docs;
};

std::vector<Segment> build_segments(const PipelineConfig& cfg) {
  std::vector<Segment> segs(1);
  for (size_t i = 0; i < cfg.stages.size(); ++i) {
    StageConfig sc(cfg.stages[i], cfg.file, int(i) + 1);
    const StageFactory* f = stage_registry().find(sc.type());
    if (!f) {
      std::vector<std::string> names;
      for (const StageFactory& g : stage_registry().all()) names.push_back(g.type);
      fail("{}: unknown stage type '{}' (known: {})", sc.where(), sc.type(),
           fmt::join(names, ", "));
    }
    if (f->make_doc) {
      segs.back().docs.push_back({sc.name(), sc.type(), f->make_doc(sc)});
    } else {
      segs.emplace_back();
      segs.back().global_name = sc.name();
      segs.back().global_type = sc.type();
      segs.back().global = f->make_global(sc);
    }
    sc.finish();
  }
  return segs;
}

// Per shard and segment: what the done-file records.
struct ShardStats {
  int64_t docs_in = 0, docs_out = 0, bad = 0, empty = 0, repaired = 0, bytes_in = 0;
  std::vector<StageStats> stages;  // the segment's: its global removals first, then doc stages
  std::vector<std::string> errors;
  Counters input_counts;  // the input reader's (WARC records skipped by kind, charsets)
};

ojson stats_json(const StageStats& s) {
  ojson counts = ojson::object();
  for (const auto& [k, v] : s.counts) counts[k] = v;
  return {{"name", s.name},       {"type", s.type},       {"global", s.global},
          {"docs_in", s.docs_in}, {"removed", s.removed}, {"bytes_in", s.bytes_in},
          {"seconds", s.seconds}, {"counts", counts}};
}

StageStats stats_from(const nlohmann::json& j) {
  StageStats s;
  s.name = j.at("name").get<std::string>();
  s.type = j.at("type").get<std::string>();
  s.global = j.at("global").get<bool>();
  s.docs_in = j.at("docs_in").get<int64_t>();
  s.removed = j.at("removed").get<int64_t>();
  s.bytes_in = j.at("bytes_in").get<int64_t>();
  s.seconds = j.at("seconds").get<double>();
  for (const auto& [k, v] : j.at("counts").items()) s.counts[k] = v.get<int64_t>();
  return s;
}

void add_stats(StageStats& into, const StageStats& s) {
  into.docs_in += s.docs_in;
  into.removed += s.removed;
  into.bytes_in += s.bytes_in;
  into.seconds += s.seconds;
  for (const auto& [k, v] : s.counts) into.counts[k] += v;
}

void write_json(const fs::path& p, const ojson& j) {
  write_file_atomic(p.string(), j.dump(1) + "\n");
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json(ss.str(), p.string());
}

std::string shard_name(size_t i) {
  return fmt::format("shard_{:05d}", i);
}

class RemovalCursor;

class Runner {
 public:
  Runner(const PipelineConfig& cfg, const RunOptions& opt) : cfg_(cfg), opt_(opt) {
    out_ = cfg.output_dir;
    work_ = out_ / ".work";
    if (opt.ranks) ranks_ = *opt.ranks;
  }

  CurateReport run();

 private:
  fs::path seg_dir(size_t k) const { return work_ / fmt::format("seg{}", k); }
  // Global stage k's results that outlive the run (GlobalStage::save).
  fs::path state_dir(size_t k) const { return work_ / fmt::format("global{}.state", k); }
  void prepare();
  void prepare_output();  // rank 0: the lock, the work folder, pipeline.json
  void run_global(size_t k);
  // Across ranks: global stage k learns its ranks (nk::Error if it cannot).
  void join_ranks(size_t k, uint64_t first);
  ShardStats process_shard(size_t k, size_t i);
  void assemble();
  void report_progress(const std::string& label, int64_t done, int64_t total, int64_t bytes,
                       int64_t docs, Clock::time_point t0, bool final);

  bool mine(size_t i) const { return i >= my_.first && i < my_.second; }
  // Documents of segment k's output (what global stage k + 1 reads) before shard i.
  int64_t docs_before(size_t k, size_t i) const {
    int64_t n = 0;
    for (size_t j = 0; j < i; ++j) n += docs_out_[k][j];
    return n;
  }

  const PipelineConfig& cfg_;
  const RunOptions& opt_;
  Ranks ranks_;                   // alone unless opt.ranks
  std::pair<size_t, size_t> my_;  // this rank's shards [first, last)
  fs::path out_, work_;
  std::vector<Shard> shards_;
  std::vector<Segment> segs_;
  std::vector<std::vector<int64_t>> docs_out_;  // [segment][shard], -1 until known
  std::unique_ptr<RemovalCursor> removals_;     // of the current segment's global stage
  // Taken once the inputs and OUT are known good, so a refused run creates nothing.
  std::optional<OutputLock> lock_;
  CurateReport report_;
  Clock::time_point last_progress_{};
};

void Runner::prepare() {
  shards_ = plan_shards(cfg_.input);
  my_ = ranks_.block(shards_.size());
  if (ranks_.rank() == 0) prepare_output();
  // Rank 0 has made (or checked) the work folder; every other rank must see
  // it: the shards one rank writes are read by the others.
  ranks_.barrier();
  if (ranks_.rank() != 0 && !fs::exists(work_ / "pipeline.json"))
    fail(
        "rank {}: output.dir '{}' is not visible here: under mpirun every rank must see the "
        "same output folder (a shared file system)",
        ranks_.rank(), out_.string());
}

void Runner::prepare_output() {
  for (const Shard& s : shards_) {  // each opens or throws
    if (s.format == SourceFormat::Jsonl) JsonlReader check(s.files[0].first);
    if (s.format == SourceFormat::Warc || s.format == SourceFormat::Wet)
      WarcReader check(s.files[0].first);
  }
  // The plan as a JSON list, built by hand: file names are bytes, not always
  // UTF-8, and every byte must count towards the hash.
  std::string plan = "[";
  for (const Shard& s : shards_)
    for (const auto& f : s.files) {
      if (plan.size() > 1) plan += ',';
      append_json_string(plan, fmt::format("{}@{}", f.first, s.offset));
    }
  plan += ']';
  std::string plan_hash = fmt::format("{:016x}", XXH3_64bits(plan.data(), plan.size()));

  std::error_code ec;
  const fs::path meta = work_ / "pipeline.json";
  if (fs::exists(meta)) {
    nlohmann::json m = read_json(meta);
    if (m.value("fingerprint", "") != cfg_.fingerprint)
      fail(
          "output.dir '{}' holds an unfinished run of a different pipeline (stages or inputs "
          "changed); use another output.dir or remove that folder",
          out_.string());
    if (m.value("inputs", "") != plan_hash)
      fail(
          "output.dir '{}': the input files changed since this run started; use another "
          "output.dir or remove that folder",
          out_.string());
    lock_.emplace(out_.string(), LockAt::Inside);
  } else {
    // A run killed before pipeline.json landed left at most its lock file and
    // a work folder without pipeline.json; such a run had not started.
    const fs::path lock_name = fs::path(OutputLock::lock_file(out_.string(), LockAt::Inside));
    for (const auto& e : fs::directory_iterator(out_, ec))
      if (e.path().filename() != lock_name.filename() && e.path().filename() != work_.filename())
        fail(
            "output.dir '{}' already exists and is not an unfinished curate run; choose a new "
            "folder",
            out_.string());
    lock_.emplace(out_.string(), LockAt::Inside);
    fs::remove_all(work_, ec);
    if (ec) fail("cannot clear '{}': {}", work_.string(), ec.message());
    fs::create_directories(work_, ec);
    if (ec) fail("cannot create output.dir '{}': {}", out_.string(), ec.message());
    write_json(
        meta,
        {{"fingerprint", cfg_.fingerprint}, {"inputs", plan_hash}, {"shards", shards_.size()}});
  }
  remove_stale_temporaries_of(out_.string(), true);
}

void Runner::report_progress(const std::string& label, int64_t done, int64_t total, int64_t bytes,
                             int64_t docs, Clock::time_point t0, bool final) {
  if (!opt_.progress) return;
  auto now = Clock::now();
  if (!final && std::chrono::duration<double>(now - last_progress_).count() < opt_.progress_every_s)
    return;
  last_progress_ = now;
  PreprocessProgress p;
  p.input_bytes_done = done;
  p.input_bytes_total = total;
  p.text_bytes = bytes;
  p.documents = docs;
  p.seconds = since(t0);
  p.finished = final;
  opt_.progress(label + " " + format_progress(p), final);
}

// Reads the previous segment's kept documents of shard i in order.
Shard work_shard(const fs::path& file) {
  Shard s;
  s.format = SourceFormat::Jsonl;
  s.files.emplace_back(file.string(), SourceFormat::Jsonl);
  s.bytes = int64_t(fs::file_size(file));
  return s;
}

InputOptions work_input_options() {
  InputOptions o;
  o.invalid_utf8 = "skip";
  return o;
}

void Runner::join_ranks(size_t k, uint64_t first) {
  Segment& seg = segs_[k];
  if (!seg.global->set_ranks(&ranks_, first))
    fail("stage '{}' ({}) runs on one process only, not under mpirun", seg.global_name,
         seg.global_type);
}

void Runner::run_global(size_t k) {
  Segment& seg = segs_[k];
  const fs::path done = work_ / fmt::format("global{}.done.json", k);
  if (fs::exists(done)) return;
  fs::path spill = work_ / fmt::format("global{}.spill", k);
  // Across ranks each reads its own shards, which start at document `first`
  // of the global order, and the stage's finish() exchanges records.
  const uint64_t first = uint64_t(docs_before(k - 1, my_.first));
  if (!ranks_.alone()) {
    spill /= fmt::format("rank{}", ranks_.rank());
    join_ranks(k, first);
  }
  std::error_code ec;
  fs::remove_all(spill, ec);
  fs::create_directories(spill, ec);
  if (ec) fail("cannot create '{}': {}", spill.string(), ec.message());

  StageStats st;
  st.name = seg.global_name;
  st.type = seg.global_type;
  st.global = true;
  auto t0 = Clock::now();
  seg.global->begin(spill.string());
  const InputOptions wopt = work_input_options();
  int64_t total = 0, done_bytes = 0;
  for (size_t i = my_.first; i < my_.second; ++i)
    total += int64_t(fs::file_size(seg_dir(k - 1) / (shard_name(i) + ".jsonl")));
  uint64_t index = first;
  std::vector<InputRecord> recs;
  std::vector<Document> docs;
  const std::string label = fmt::format("[{}]", seg.global_name);
  for (size_t i = my_.first; i < my_.second; ++i) {
    Shard ws = work_shard(seg_dir(k - 1) / (shard_name(i) + ".jsonl"));
    ShardReader reader(ws, wopt);
    int64_t base = done_bytes;
    while (reader.next(recs, size_t(cfg_.batch_mb) << 20)) {
      docs.clear();
      for (InputRecord& r : recs) {
        if (!r.ok)
          fail("{}: {} (a work file of this run is damaged; remove '{}' and rerun)", r.where,
               r.error, work_.string());
        st.bytes_in += int64_t(r.doc.text.size());
        docs.push_back(std::move(r.doc));
      }
      seg.global->add_batch(index, docs);
      index += docs.size();
      report_progress(label, base + reader.bytes_done(), total, st.bytes_in, int64_t(index - first),
                      t0, false);
    }
    done_bytes = base + ws.bytes;
  }
  std::vector<Removal> removals = seg.global->finish(st.counts);
  report_progress(label, total, total, st.bytes_in, int64_t(index - first), t0, true);
  st.docs_in = ranks_.sum(int64_t(index - first));
  st.bytes_in = ranks_.sum(st.bytes_in);
  st.removed = int64_t(removals.size());
  st.seconds = ranks_.sum(int64_t(since(t0) * num_threads() * 1e6)) / 1e6;
  for (size_t j = 0; j < removals.size(); ++j) {
    NK_CHECK(removals[j].index < uint64_t(st.docs_in) &&
                 (j == 0 || removals[j - 1].index < removals[j].index),
             "stage '{}': removals must be sorted, unique and in range", seg.global_name);
  }
  // What outlives the run: saved by every rank together, into rank 0's folder.
  const fs::path keep = state_dir(k);
  if (ranks_.rank() == 0) {
    fs::remove_all(keep, ec);
    fs::create_directories(keep, ec);
    if (ec) fail("cannot create '{}': {}", keep.string(), ec.message());
  }
  ranks_.barrier();
  seg.global->save(keep.string());
  if (ranks_.rank() != 0) {
    // Rank 0 writes what every rank decided alike.
    ranks_.barrier();
    fs::remove_all(spill, ec);
    return;
  }
  {
    AtomicFileWriter w((work_ / fmt::format("global{}.removals.jsonl", k)).string());
    std::string buf;
    for (const Removal& r : removals) {
      buf += fmt::format("{{\"index\":{},\"reason\":", r.index);
      append_json_string(buf, r.reason);
      buf += "}\n";
      if (buf.size() > (1u << 20)) {
        w.write(buf.data(), buf.size());
        buf.clear();
      }
    }
    w.write(buf.data(), buf.size());
    w.commit();
  }
  write_json(done, stats_json(st));
  ranks_.barrier();
  fs::remove_all(ranks_.alone() ? spill : spill.parent_path(), ec);
}

// A global stage's removals (sorted by index), read forward once per segment:
// shards ask for consecutive index ranges, so the file is never re-read.
class RemovalCursor {
 public:
  explicit RemovalCursor(const fs::path& file) : file_(file.string()), reader_(file_) {}

  // The removals in [first, first + n), by offset from `first`. Ranges must
  // come in increasing order (skipped ranges are passed over).
  std::map<int64_t, std::string> take(int64_t first, int64_t n) {
    std::map<int64_t, std::string> out;
    for (;;) {
      if (!have_) {
        std::string_view line;
        int64_t line_no = 0;
        if (!reader_.read_line(line, line_no)) break;
        nlohmann::json j = parse_json(std::string(line), fmt::format("{}:{}", file_, line_no));
        index_ = j.at("index").get<int64_t>();
        reason_ = j.at("reason").get<std::string>();
        have_ = true;
      }
      if (index_ >= first + n) break;
      if (index_ >= first) out[index_ - first] = std::move(reason_);
      have_ = false;
    }
    return out;
  }

 private:
  std::string file_;
  JsonlReader reader_;
  bool have_ = false;  // a read-ahead removal in index_/reason_
  int64_t index_ = 0;
  std::string reason_;
};

bool blank(const std::string& s) {
  return s.find_first_not_of(" \t\r\n\f\v") == std::string::npos;
}

ShardStats Runner::process_shard(size_t k, size_t i) {
  Segment& seg = segs_[k];
  const fs::path dir = seg_dir(k);
  const std::string name = shard_name(i);
  ShardStats ss;
  const size_t nstages = seg.docs.size() + (seg.global ? 1 : 0);
  ss.stages.resize(nstages);
  size_t s0 = 0;
  if (seg.global) {
    ss.stages[0].name = seg.global_name;
    ss.stages[0].type = seg.global_type;
    ss.stages[0].global = true;
    s0 = 1;
  }
  for (size_t s = 0; s < seg.docs.size(); ++s) {
    ss.stages[s0 + s].name = seg.docs[s].name;
    ss.stages[s0 + s].type = seg.docs[s].type;
  }

  // The source: the input shard, or what the previous segment kept.
  Shard ws;
  InputOptions wopt = work_input_options();
  const Shard* src = &shards_[i];
  const InputOptions* iopt = &cfg_.input;
  std::map<int64_t, std::string> drop;
  if (k > 0) {
    ws = work_shard(seg_dir(k - 1) / (name + ".jsonl"));
    src = &ws;
    iopt = &wopt;
    drop = removals_->take(docs_before(k - 1, i), docs_out_[k - 1][i]);
  }

  AtomicFileWriter out((dir / (name + ".jsonl")).string());
  AtomicFileWriter removed((dir / (name + ".removed.jsonl")).string());
  std::vector<InputRecord> recs;
  std::mutex mu;
  int64_t offset = 0;  // documents of the source read so far (for global removals)
  auto t0 = Clock::now();
  const std::string label =
      fmt::format("[{} {}/{}]", k == 0 ? "input" : seg.global_name, i + 1, shards_.size());
  int64_t text_bytes = 0;
  std::unique_ptr<ShardReader> reader_ptr;
  try {
    reader_ptr = std::make_unique<ShardReader>(*src, *iopt);
    ShardReader& reader = *reader_ptr;
    while (reader.next(recs, size_t(cfg_.batch_mb) << 20)) {
      const int64_t n = int64_t(recs.size());
      std::vector<int> removed_at(size_t(n), -1);  // stage index that removed it; -2: input
      std::vector<std::string> why(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        InputRecord& r = recs[size_t(j)];
        ss.docs_in += 1;
        ss.bytes_in += r.bytes;
        text_bytes += r.bytes;
        if (r.repaired) ++ss.repaired;
        if (!r.ok) {
          ++ss.bad;
          removed_at[size_t(j)] = -2;
          why[size_t(j)] = r.where + ": " + r.error;
          continue;
        }
        if (k == 0 && blank(r.doc.text)) {
          ++ss.empty;
          removed_at[size_t(j)] = -2;
          why[size_t(j)] = "empty document";
          continue;
        }
        if (seg.global) {
          StageStats& g = ss.stages[0];
          ++g.docs_in;
          g.bytes_in += int64_t(r.doc.text.size());
          auto it = drop.find(offset + j);
          if (it != drop.end()) {
            ++g.removed;
            removed_at[size_t(j)] = 0;
            why[size_t(j)] = it->second;
          }
        }
      }
      offset += n;
      // Document stages, in parallel; each chunk keeps its own statistics.
      parallel_for(n, 1, [&](int64_t b, int64_t e) {
        std::vector<StageStats> local(nstages);
        for (int64_t j = b; j < e; ++j) {
          InputRecord& r = recs[size_t(j)];
          for (size_t s = 0; s < seg.docs.size() && removed_at[size_t(j)] == -1; ++s) {
            StageStats& st = local[s0 + s];
            ++st.docs_in;
            st.bytes_in += int64_t(r.doc.text.size());
            auto t = Clock::now();
            Verdict v = seg.docs[s].stage->apply(r.doc, st.counts);
            st.seconds += since(t);
            if (!v.keep) {
              ++st.removed;
              removed_at[size_t(j)] = int(s0 + s);
              why[size_t(j)] = std::move(v.reason);
            }
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        for (size_t s = s0; s < nstages; ++s) add_stats(ss.stages[s], local[s]);
      });
      // Records, serialised in parallel, written in order.
      std::vector<std::string> kchunks(static_cast<size_t>(n)), rchunks(static_cast<size_t>(n));
      parallel_for(n, 64, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) {
          const InputRecord& r = recs[size_t(j)];
          int at = removed_at[size_t(j)];
          if (at == -1) {
            append_record(kchunks[size_t(j)], r.doc);
          } else {
            std::string by = at == -2 ? "input" : ss.stages[size_t(at)].name;
            append_record(rchunks[size_t(j)], r.doc, by, why[size_t(j)]);
          }
        }
      });
      for (int64_t j = 0; j < n; ++j) {
        if (removed_at[size_t(j)] == -1) ++ss.docs_out;
        out.write(kchunks[size_t(j)].data(), kchunks[size_t(j)].size());
        removed.write(rchunks[size_t(j)].data(), rchunks[size_t(j)].size());
      }
      report_progress(label, reader.bytes_done(), src->bytes, text_bytes, ss.docs_in, t0, false);
    }
  } catch (const Error& e) {
    // A corrupt stream (zstd) or a file that vanished: the records before it
    // stay, the run goes on, and the report names the problem.
    ss.errors.push_back(escape_invalid_utf8(e.what()));  // it may name a file that is not UTF-8
    NK_WARN("curate: {}", e.what());
  }
  if (reader_ptr) ss.input_counts = reader_ptr->counts();
  report_progress(label, src->bytes, src->bytes, text_bytes, ss.docs_in, t0, true);
  removed.commit();
  out.commit();
  ojson st = ojson::array();
  for (const StageStats& s : ss.stages) st.push_back(stats_json(s));
  ojson ic = ojson::object();
  for (const auto& [key, v] : ss.input_counts) ic[key] = v;
  write_json(dir / (name + ".done.json"), {{"docs_in", ss.docs_in},
                                           {"docs_out", ss.docs_out},
                                           {"bad", ss.bad},
                                           {"empty", ss.empty},
                                           {"repaired", ss.repaired},
                                           {"bytes_in", ss.bytes_in},
                                           {"stages", st},
                                           {"errors", ss.errors},
                                           {"input_counts", ic}});
  return ss;
}

ShardStats load_shard_stats(const fs::path& done) {
  nlohmann::json j = read_json(done);
  ShardStats ss;
  ss.docs_in = j.at("docs_in").get<int64_t>();
  ss.docs_out = j.at("docs_out").get<int64_t>();
  ss.bad = j.at("bad").get<int64_t>();
  ss.empty = j.at("empty").get<int64_t>();
  ss.repaired = j.at("repaired").get<int64_t>();
  ss.bytes_in = j.at("bytes_in").get<int64_t>();
  for (const auto& s : j.at("stages")) ss.stages.push_back(stats_from(s));
  for (const auto& e : j.at("errors")) ss.errors.push_back(e.get<std::string>());
  if (j.contains("input_counts"))
    for (const auto& [k, v] : j.at("input_counts").items()) ss.input_counts[k] = v.get<int64_t>();
  return ss;
}

void Runner::assemble() {
  std::error_code ec;
  fs::create_directories(out_ / "data", ec);
  fs::create_directories(out_ / "removed", ec);
  const size_t last = segs_.size() - 1;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const std::string name = shard_name(i);
    AtomicFileWriter w((out_ / "removed" / (name + ".jsonl")).string());
    std::vector<char> buf(size_t(4) << 20);
    for (size_t k = 0; k <= last; ++k) {
      std::ifstream in(seg_dir(k) / (name + ".removed.jsonl"), std::ios::binary);
      if (!in) fail("cannot read '{}'", (seg_dir(k) / (name + ".removed.jsonl")).string());
      while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0)
        w.write(buf.data(), size_t(in.gcount()));
    }
    w.commit();
    fs::path from = seg_dir(last) / (name + ".jsonl");
    if (fs::exists(from)) fs::rename(from, out_ / "data" / (name + ".jsonl"));
  }
}

CurateReport Runner::run() {
  auto t0 = Clock::now();
  // Every stage is built (models loaded, keys checked) before anything is
  // written: a configuration mistake leaves no output behind.
  segs_ = build_segments(cfg_);
  // A global stage that cannot run across ranks is refused before any work.
  if (!ranks_.alone())
    for (size_t k = 1; k < segs_.size(); ++k) join_ranks(k, 0);
  // report.json is written last, after every shard is in place: it marks a
  // finished run (a kill while .work/ was being removed leaves only scratch).
  if (fs::exists(out_ / "report.json")) {
    if (ranks_.rank() == 0) {
      lock_.emplace(out_.string(), LockAt::Inside);
      std::error_code ec;
      fs::remove_all(work_, ec);
      remove_stale_temporaries_of(out_.string(), true);
    }
    NK_INFO("curate: '{}' is complete (report.json); nothing to do", out_.string());
    report_.wall_seconds = since(t0);
    report_.errors.clear();
    return report_;
  }
  prepare();
  std::error_code ec;
  docs_out_.assign(segs_.size(), std::vector<int64_t>(shards_.size(), -1));
  std::vector<std::vector<ShardStats>> all(segs_.size(), std::vector<ShardStats>(shards_.size()));
  for (size_t k = 0; k < segs_.size(); ++k) {
    fs::create_directories(seg_dir(k), ec);
    if (k > 0) {
      run_global(k);
      removals_ =
          std::make_unique<RemovalCursor>(work_ / fmt::format("global{}.removals.jsonl", k));
    }
    for (size_t i = my_.first; i < my_.second; ++i) {
      const fs::path done = seg_dir(k) / (shard_name(i) + ".done.json");
      if (fs::exists(done)) {
        all[k][i] = load_shard_stats(done);
        ++report_.resumed_shards;
      } else {
        all[k][i] = process_shard(k, i);
      }
      docs_out_[k][i] = all[k][i].docs_out;
    }
    // The other ranks' shards of this segment, from their done-files.
    ranks_.barrier();
    for (size_t i = 0; i < shards_.size(); ++i) {
      if (mine(i)) continue;
      all[k][i] = load_shard_stats(seg_dir(k) / (shard_name(i) + ".done.json"));
      docs_out_[k][i] = all[k][i].docs_out;
    }
    // The previous segment's kept documents are no longer needed.
    if (k > 0)
      for (size_t i = my_.first; i < my_.second; ++i)
        fs::remove(seg_dir(k - 1) / (shard_name(i) + ".jsonl"), ec);
  }
  report_.resumed_shards = int(ranks_.sum(report_.resumed_shards));
  if (ranks_.rank() != 0) {
    // Rank 0 assembles the output; the others wait until it is complete.
    ranks_.barrier();
    report_.wall_seconds = since(t0);
    return report_;
  }
  assemble();

  // The report covers every shard, also those a previous run finished.
  report_.shards = int64_t(shards_.size());
  for (const Shard& s : shards_) report_.input_bytes += s.bytes;
  for (size_t k = 0; k < segs_.size(); ++k) {
    std::vector<StageStats> seg_stats;
    for (size_t i = 0; i < shards_.size(); ++i) {
      const ShardStats& ss = all[k][i];
      if (seg_stats.empty()) seg_stats = std::vector<StageStats>(ss.stages.size());
      for (size_t s = 0; s < ss.stages.size(); ++s) {
        if (seg_stats[s].name.empty()) {
          seg_stats[s].name = ss.stages[s].name;
          seg_stats[s].type = ss.stages[s].type;
          seg_stats[s].global = ss.stages[s].global;
        }
        add_stats(seg_stats[s], ss.stages[s]);
      }
      if (k == 0) {
        report_.input_docs += ss.docs_in;
        report_.bad_records += ss.bad;
        report_.empty_docs += ss.empty;
        report_.utf8_repaired += ss.repaired;
        for (const auto& [key, v] : ss.input_counts) report_.input_counts[key] += v;
      }
      if (k + 1 == segs_.size()) report_.output_docs += ss.docs_out;
      for (const std::string& e : ss.errors) report_.errors.push_back(e);
    }
    if (k > 0 && !seg_stats.empty()) {
      // The global stage's own time and counters come from its done-file.
      StageStats g = stats_from(read_json(work_ / fmt::format("global{}.done.json", k)));
      seg_stats[0].seconds = g.seconds;
      seg_stats[0].counts = g.counts;
    }
    for (StageStats& s : seg_stats) report_.stages.push_back(std::move(s));
  }
  report_.removed_docs = report_.input_docs - report_.output_docs;
  // What outlives the run goes in place once the output is complete (and
  // before report.json, which marks the run finished).
  for (size_t k = 1; k < segs_.size(); ++k) segs_[k].global->publish(state_dir(k).string());
  if (opt_.before_report) opt_.before_report(report_);
  write_json(out_ / "report.json", report_.to_json());
  fs::remove_all(work_, ec);
  report_.wall_seconds = since(t0);
  ranks_.barrier();
  return report_;
}

}  // namespace

CurateReport run_pipeline(const PipelineConfig& cfg, const RunOptions& opt) {
  if (cfg.workers > 0) set_num_threads(cfg.workers);
  Runner r(cfg, opt);
  return r.run();
}

}  // namespace nk::curate
