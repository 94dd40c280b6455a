#include "eval/results.h"

#include <fmt/format.h>

namespace nk {

using Json = nlohmann::ordered_json;

Json results_json(const std::vector<TaskConfig>& configs, const std::vector<TaskResult>& results,
                  const Json& run_config) {
  // Built apart and put in at the end: an ordered_json's members live in a
  // vector, so a reference to one does not survive the next insertion.
  Json res = Json::object(), groups = Json::object(), cfgs = Json::object(),
       versions = Json::object(), nshot = Json::object(), hib = Json::object(),
       nsamples = Json::object();
  for (size_t t = 0; t < results.size(); ++t) {
    const TaskResult& r = results[t];
    Json m;
    m["alias"] = configs[t].alias;
    for (const MetricValue& v : r.metrics) {
      const size_t comma = v.key.find(',');
      const std::string metric = v.key.substr(0, comma), filter = v.key.substr(comma + 1);
      m[v.key] = v.value;
      m[metric + "_stderr," + filter] = v.stderr_ ? Json(*v.stderr_) : Json("N/A");
      hib[r.task][metric] = v.higher_is_better;
    }
    res[r.task] = m;
    groups[r.task] = Json::array();
    Json c = configs[t].raw;
    c["num_fewshot"] = r.num_fewshot;
    cfgs[r.task] = c;
    versions[r.task] = configs[t].version;
    nshot[r.task] = r.num_fewshot;
    nsamples[r.task] = {{"original", r.n_total}, {"effective", r.n_docs}};
  }
  Json j;
  j["results"] = res;
  j["group_subtasks"] = groups;
  j["configs"] = cfgs;
  j["versions"] = versions;
  j["n-shot"] = nshot;
  j["higher_is_better"] = hib;
  j["n-samples"] = nsamples;
  j["config"] = run_config;
  return j;
}

std::string results_table(const std::vector<TaskConfig>& configs,
                          const std::vector<TaskResult>& results) {
  std::vector<std::vector<std::string>> rows = {
      {"Tasks", "Version", "Filter", "n-shot", "Metric", "", "Value", "", "Stderr"}};
  for (size_t t = 0; t < results.size(); ++t) {
    const TaskResult& r = results[t];
    const Json& ver = configs[t].version;
    const std::string version = ver.is_null()     ? "N/A"
                                : ver.is_string() ? ver.get<std::string>()
                                                  : Json(ver).dump();
    bool first = true;
    for (const MetricValue& v : r.metrics) {
      const size_t comma = v.key.find(',');
      rows.push_back({first ? r.task : "", first ? version : "", v.key.substr(comma + 1),
                      fmt::format("{}", r.num_fewshot), v.key.substr(0, comma),
                      v.higher_is_better ? "↑" : "↓", fmt::format("{:.4f}", v.value), "±",
                      v.stderr_ ? fmt::format("{:.4f}", *v.stderr_) : "N/A"});
      first = false;
    }
  }
  // Widths in code points (the arrows are one each).
  auto width = [](const std::string& s) {
    size_t n = 0;
    for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
    return n;
  };
  std::vector<size_t> w(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t k = 0; k < row.size(); ++k) w[k] = std::max(w[k], width(row[k]));
  std::string out;
  for (size_t i = 0; i < rows.size(); ++i) {
    out += "|";
    for (size_t k = 0; k < rows[i].size(); ++k) {
      const std::string pad(w[k] - width(rows[i][k]), ' ');
      const bool right = k == 1 || k == 3 || k == 6 || k == 8;
      out += right ? pad + rows[i][k] : rows[i][k] + pad;
      out += "|";
    }
    out += "\n";
    if (i == 0) {
      out += "|";
      for (size_t k = 0; k < w.size(); ++k)
        out += std::string(std::max<size_t>(w[k], 1), '-') + "|";
      out += "\n";
    }
  }
  return out;
}

}  // namespace nk
