// Training metrics: a human log line and the same figures as one JSON object
// per line (JSONL) for tools.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace nk {

class MetricsWriter {
 public:
  // Truncates (or appends to, for a resumed run); nk::Error if unwritable.
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // {"k": v, ...} with numbers printed at full precision; then each of
  // `arrays` as "k": [v, ...].
  void write(const std::vector<std::pair<std::string, double>>& fields,
             const std::vector<std::pair<std::string, std::vector<double>>>& arrays = {});

 private:
  FILE* f_ = nullptr;
};

// Drops the records after `step` (and a torn last line) from a metrics file,
// so a run resumed from an older checkpoint than its last logged step does not
// log those steps twice. Atomic; a missing file is left missing.
void keep_metrics_through_step(const std::string& path, int64_t step);

// Peak resident set size of this process in bytes.
size_t peak_rss_bytes();

}  // namespace nk
