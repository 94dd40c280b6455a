// `nekton curate`: runs an ordered list of stages over documents.
//
// The stages are cut into segments at each global stage (dedup): segment 0 runs
// the document stages before the first global stage over the input shards;
// each global stage then reads every document the previous segment kept,
// decides which to remove, and the next segment applies those removals and
// its own document stages, shard by shard. Within a shard, documents are read
// in batches of batch_mb and processed in parallel over the thread pool, in
// bounded memory; output keeps input order, so a run is deterministic.
//
// Layout of OUT:
//   data/shard_NNNNN.jsonl     kept documents, {"id", "text", other fields...}
//   removed/shard_NNNNN.jsonl  removed ones, plus "removed_by" and "reason"
//   report.json                per stage: documents in/kept/removed, time, counters
//   .work/                     while running: per-segment shard outputs, a
//                              done-file per finished shard, global stages'
//                              decisions. A rerun skips what is done (resume).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "curate/document.h"
#include "curate/pipeline/input.h"

namespace nk::curate {

struct PipelineConfig {
  std::string file;  // the pipeline YAML, for messages
  InputOptions input;
  std::string output_dir;
  int workers = 0;                // threads; 0 = all cores
  int64_t batch_mb = 16;          // documents read and processed together
  std::string progress = "auto";  // auto, bar, log, none
  YAML::Node stages;              // the `stages:` list
  std::string fingerprint;        // of everything that decides the output
};

// Reads the pipeline file, then applies "key=value" overrides of its scalar
// settings (input.paths=a,b  output.dir=x  workers=2 ...). nk::Error naming the
// file and line, or the override, for anything wrong. The stages themselves
// (types, keys, models) are built and checked by run_pipeline, once, before
// it writes anything.
PipelineConfig load_pipeline_config(const std::string& path,
                                    const std::vector<std::string>& overrides);

struct StageStats {
  std::string name, type;
  bool global = false;
  int64_t docs_in = 0, removed = 0;
  int64_t bytes_in = 0;  // text bytes of the documents it saw
  double seconds = 0;    // thread-seconds spent in the stage
  Counters counts;
};

struct CurateReport {
  int64_t shards = 0, input_docs = 0, output_docs = 0, removed_docs = 0;
  int64_t input_bytes = 0;     // on disk
  int64_t bad_records = 0;     // unreadable or unparsable input records (in removed/)
  int64_t empty_docs = 0;      // empty or whitespace-only documents (in removed/)
  int64_t utf8_repaired = 0;   // records kept with invalid UTF-8 replaced by U+FFFD
  int64_t resumed_shards = 0;  // shard-segments found done and skipped
  std::vector<StageStats> stages;
  double wall_seconds = 0;          // of this invocation
  std::vector<std::string> errors;  // e.g. a corrupt zstd stream: file, offset

  nlohmann::ordered_json to_json() const;
  std::string table() const;  // the human summary printed at the end
};

struct RunOptions {
  // Called from the calling thread with a one-line status (a bar with docs/s
  // and MB/s) at most every progress_every_s; `final` on a segment's end.
  std::function<void(const std::string& line, bool final)> progress;
  double progress_every_s = 0.25;
};

CurateReport run_pipeline(const PipelineConfig& cfg, const RunOptions& opt);

}  // namespace nk::curate
