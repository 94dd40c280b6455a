// `nekton curate`'s counters as a TensorBoard event file in output.dir
// (`tensorboard: true`, the default), written by train/tensorboard.h's
// writer once the run's report.json is in place.
//
// The stages are the step axis, so TensorBoard draws the pipeline's funnel:
//   step 0        the run's totals: input_docs, output_docs, removed_docs,
//                 input_bytes, bad_records, empty_docs, utf8_repaired, shards,
//                 and the input readers' counts as input/<name>
//   step s (1..)  stage s of report.json's `stages`: docs_in, kept, removed,
//                 bytes_in, seconds, and its own counters as counts/<name>
// The stage's name is in report.json; the tags are the same at every step.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "curate/pipeline/report.h"

namespace nk {

// The scalars of each step above (index = step).
std::vector<std::vector<std::pair<std::string, double>>> curate_event_scalars(
    const curate::CurateReport& r);

// Replaces the event files of `dir` with one holding them; returns its path.
// nk::Error naming the file when it cannot be written.
std::string write_curate_events(const std::string& dir, const curate::CurateReport& r);

}  // namespace nk
