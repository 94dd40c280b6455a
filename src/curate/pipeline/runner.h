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
//                              decisions and what they save to publish at the
//                              end (GlobalStage::save, globalK.state/). A rerun
//                              skips what is done (resume).
#pragma once
#include <functional>
#include <string>

#include "curate/pipeline/config.h"
#include "curate/pipeline/report.h"
#include "curate/ranks.h"

namespace nk::curate {

struct RunOptions {
  // Called from the calling thread with a one-line status (a bar with docs/s
  // and MB/s) at most every progress_every_s; `final` on a segment's end.
  std::function<void(const std::string& line, bool final)> progress;
  double progress_every_s = 0.25;
  // Under mpirun: the ranks of the run (curate/ranks.h). Each curates a
  // contiguous block of the shards; global stages exchange their records;
  // rank 0 alone takes the output lock and writes removals, the output
  // folders and report.json. OUT must be on a file system every rank sees.
  // The output is the same bytes for any number of ranks.
  const Ranks* ranks = nullptr;
  // On the rank that writes the output, with the finished report, while the
  // output lock is held and before report.json marks the run finished
  // (nekton curate writes its TensorBoard event file here).
  std::function<void(const CurateReport&)> before_report;
};

CurateReport run_pipeline(const PipelineConfig& cfg, const RunOptions& opt);

}  // namespace nk::curate
