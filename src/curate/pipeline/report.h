// What a curate run reports: per stage the documents it saw, kept and
// removed, the bytes, time and the stage's own counters; written as
// OUT/report.json and printed as a table at the end.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "curate/document.h"

namespace nk::curate {

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
  // The input readers' counts: WARC records skipped by kind
  // ("warc_skipped_request", "warc_skipped_non_html", ...), damaged ones
  // ("warc_corrupt_records", also in bad_records), and where the charsets of
  // pages came from ("charset_header", "charset_meta", "charset_detected", ...).
  Counters input_counts;
  std::vector<StageStats> stages;
  double wall_seconds = 0;          // of this invocation
  std::vector<std::string> errors;  // e.g. a corrupt zstd stream: file, offset

  nlohmann::ordered_json to_json() const;
  std::string table() const;  // the human summary printed at the end
};

}  // namespace nk::curate
