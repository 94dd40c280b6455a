#include "apps/curate_events.h"

#include "train/tensorboard.h"

namespace nk {

std::vector<std::vector<std::pair<std::string, double>>> curate_event_scalars(
    const curate::CurateReport& r) {
  std::vector<std::vector<std::pair<std::string, double>>> out;
  std::vector<std::pair<std::string, double>> totals = {
      {"input_docs", double(r.input_docs)},       {"output_docs", double(r.output_docs)},
      {"removed_docs", double(r.removed_docs)},   {"input_bytes", double(r.input_bytes)},
      {"bad_records", double(r.bad_records)},     {"empty_docs", double(r.empty_docs)},
      {"utf8_repaired", double(r.utf8_repaired)}, {"shards", double(r.shards)}};
  for (const auto& [k, v] : r.input_counts) totals.emplace_back("input/" + k, double(v));
  out.push_back(std::move(totals));
  for (const curate::StageStats& s : r.stages) {
    std::vector<std::pair<std::string, double>> st = {{"docs_in", double(s.docs_in)},
                                                      {"kept", double(s.docs_in - s.removed)},
                                                      {"removed", double(s.removed)},
                                                      {"bytes_in", double(s.bytes_in)},
                                                      {"seconds", s.seconds}};
    for (const auto& [k, v] : s.counts) st.emplace_back("counts/" + k, double(v));
    out.push_back(std::move(st));
  }
  return out;
}

std::string write_curate_events(const std::string& dir, const curate::CurateReport& r) {
  // A fresh file (resume_step 0): a rerun's report.json is rewritten whole too.
  EventFileWriter w(dir, 0, true);
  const auto steps = curate_event_scalars(r);
  for (size_t s = 0; s < steps.size(); ++s) w.add_scalars(int64_t(s), steps[s]);
  return w.path();
}

}  // namespace nk
