#include "curate/pipeline/report.h"

#include <algorithm>

#include <fmt/format.h>

namespace nk::curate {

using ojson = nlohmann::ordered_json;

nlohmann::ordered_json CurateReport::to_json() const {
  ojson st = ojson::array();
  for (const StageStats& s : stages) {
    ojson counts = ojson::object();
    for (const auto& [k, v] : s.counts) counts[k] = v;
    st.push_back({{"name", s.name},
                  {"type", s.type},
                  {"global", s.global},
                  {"docs_in", s.docs_in},
                  {"kept", s.docs_in - s.removed},
                  {"removed", s.removed},
                  {"bytes_in", s.bytes_in},
                  {"seconds", s.seconds},
                  {"mb_per_s_per_core", s.seconds > 0 ? double(s.bytes_in) / 1e6 / s.seconds : 0.0},
                  {"counts", counts}});
  }
  ojson ic = ojson::object();
  for (const auto& [k, v] : input_counts) ic[k] = v;
  return {{"shards", shards},
          {"input_docs", input_docs},
          {"output_docs", output_docs},
          {"removed_docs", removed_docs},
          {"input_bytes", input_bytes},
          {"bad_records", bad_records},
          {"empty_docs", empty_docs},
          {"utf8_repaired", utf8_repaired},
          {"input_counts", ic},
          {"stages", st},
          {"errors", errors}};
}

std::string CurateReport::table() const {
  std::string s;
  if (!input_counts.empty()) {
    s += "input\n";
    for (const auto& [k, v] : input_counts) s += fmt::format("  {:<26} {:>10}\n", k, v);
  }
  s += fmt::format("{:<28} {:>10} {:>10} {:>10} {:>9} {:>10}\n", "stage", "in", "kept", "removed",
                   "time", "MB/s/core");
  for (const StageStats& st : stages) {
    s += fmt::format("{:<28} {:>10} {:>10} {:>10} {:>8.2f}s {:>10.1f}\n",
                     st.name + (st.global ? "*" : ""), st.docs_in, st.docs_in - st.removed,
                     st.removed, st.seconds,
                     st.seconds > 0 ? double(st.bytes_in) / 1e6 / st.seconds : 0.0);
    for (const auto& [k, v] : st.counts) s += fmt::format("  {:<26} {:>10}\n", k, v);
  }
  s += fmt::format(
      "{} shards: {} documents in, {} kept, {} removed ({} unreadable, {} empty); {} repaired "
      "UTF-8\n",
      shards, input_docs, output_docs, removed_docs, bad_records, empty_docs, utf8_repaired);
  if (std::any_of(stages.begin(), stages.end(), [](const StageStats& x) { return x.global; }))
    s += "* global stage: time is wall time times threads\n";
  for (const std::string& e : errors) s += "error: " + e + "\n";
  return s;
}

}  // namespace nk::curate
