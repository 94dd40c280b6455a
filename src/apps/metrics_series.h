// A training run's metrics.jsonl as curves: for each numeric metric, its
// (step, value) points in file order. What `nekton plot` draws.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace nk {

struct RunMetrics {
  std::string name;  // the run's folder name, for the legend
  std::string file;  // the metrics.jsonl read
  // metric -> [(step, value)]; null (non-finite) values are left out.
  std::map<std::string, std::vector<std::pair<double, double>>> series;
};

// Reads RUN (a run's OUT_DIR holding metrics.jsonl, or a metrics file itself).
// nk::Error naming the file for a missing or empty file, and the file and line
// for a line that is not a JSON object with a numeric "step". A last line
// without its newline is a record still being written and is skipped.
RunMetrics read_run_metrics(const std::string& run);

}  // namespace nk
