#include "eval/results.h"

#include <fmt/format.h>

#include <set>

namespace nk {

using Json = nlohmann::ordered_json;

namespace {

std::string indent(int depth) {
  return depth > 0 ? std::string(size_t(depth), ' ') + "- " : "";
}

std::string version_text(const Json& ver) {
  return ver.is_null() ? "N/A" : ver.is_string() ? ver.get<std::string>() : Json(ver).dump();
}

// The rows of the hierarchy in the harness's order: a group, then its
// children; each task once.
struct Row {
  const SuiteNode* node;
  int depth;
};
void walk(const SuiteNode& n, int depth, std::vector<Row>& out, std::set<int64_t>& seen_tasks) {
  if (n.task >= 0 && !seen_tasks.insert(n.task).second) return;
  out.push_back({&n, depth});
  for (const SuiteNode& c : n.children) walk(c, depth + 1, out, seen_tasks);
}
std::vector<Row> rows_of(const TaskSuite& suite) {
  std::vector<Row> rows;
  std::set<int64_t> seen;
  for (const SuiteNode& r : suite.roots) walk(r, 0, rows, seen);
  return rows;
}

void put_metrics(Json& m, const std::vector<MetricValue>& metrics) {
  for (const MetricValue& v : metrics) {
    const size_t comma = v.key.find(',');
    m[v.key] = v.value;
    m[v.key.substr(0, comma) + "_stderr," + v.key.substr(comma + 1)] =
        v.stderr_ ? Json(*v.stderr_) : Json("N/A");
  }
}

}  // namespace

Json results_json(const TaskSuite& suite, const std::vector<TaskResult>& results,
                  const std::vector<GroupResult>& groups, const Json& run_config) {
  // Built apart and put in at the end: an ordered_json's members live in a
  // vector, so a reference to one does not survive the next insertion.
  Json res = Json::object(), grp = Json::object(), subtasks = Json::object(), cfgs = Json::object(),
       versions = Json::object(), nshot = Json::object(), hib = Json::object(),
       nsamples = Json::object();
  for (const Row& row : rows_of(suite)) {
    Json m;
    if (row.node->group >= 0) {
      const GroupConfig& g = suite.groups[size_t(row.node->group)];
      const GroupResult& gr = groups[size_t(row.node->group)];
      m["alias"] = indent(row.depth) + g.alias;
      put_metrics(m, gr.metrics);
      res[g.group] = m;
      if (g.aggregate) {
        grp[g.group] = m;
        for (const MetricValue& v : gr.metrics)
          hib[g.group][v.key.substr(0, v.key.find(','))] = v.higher_is_better;
      }
      subtasks[g.group] = gr.subtasks;
      versions[g.group] = g.version;
      continue;
    }
    const TaskConfig& c = suite.tasks[size_t(row.node->task)];
    const TaskResult& r = results[size_t(row.node->task)];
    m["alias"] = indent(row.depth) + c.alias;
    put_metrics(m, r.metrics);
    for (const MetricValue& v : r.metrics)
      hib[r.task][v.key.substr(0, v.key.find(','))] = v.higher_is_better;
    res[r.task] = m;
    subtasks[r.task] = Json::array();
    Json cf = c.raw;
    cf["num_fewshot"] = r.num_fewshot;
    cfgs[r.task] = cf;
    versions[r.task] = c.version;
    nshot[r.task] = r.num_fewshot;
    nsamples[r.task] = {{"original", r.n_total}, {"effective", r.n_docs}};
  }
  Json j;
  j["results"] = res;
  if (!grp.empty()) j["groups"] = grp;
  j["group_subtasks"] = subtasks;
  j["configs"] = cfgs;
  j["versions"] = versions;
  j["n-shot"] = nshot;
  j["higher_is_better"] = hib;
  j["n-samples"] = nsamples;
  j["config"] = run_config;
  return j;
}

namespace {

std::string markdown(const std::vector<std::vector<std::string>>& rows) {
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

void metric_rows(std::vector<std::vector<std::string>>& rows, const std::string& name,
                 const std::string& version, const std::string& nshot,
                 const std::vector<MetricValue>& metrics) {
  if (metrics.empty()) rows.push_back({name, version, "", "", "", "", "", "", ""});
  bool first = true;
  for (const MetricValue& v : metrics) {
    const size_t comma = v.key.find(',');
    rows.push_back({first ? name : "", first ? version : "", v.key.substr(comma + 1), nshot,
                    v.key.substr(0, comma), v.higher_is_better ? "↑" : "↓",
                    fmt::format("{:.4f}", v.value), "±",
                    v.stderr_ ? fmt::format("{:.4f}", *v.stderr_) : "N/A"});
    first = false;
  }
}

}  // namespace

std::string results_table(const TaskSuite& suite, const std::vector<TaskResult>& results,
                          const std::vector<GroupResult>& groups) {
  const std::vector<std::string> head = {"Tasks", "Version", "Filter", "n-shot", "Metric",
                                         "",      "Value",   "",       "Stderr"};
  std::vector<std::vector<std::string>> rows = {head}, group_rows = {head};
  group_rows[0][0] = "Groups";
  for (const Row& row : rows_of(suite)) {
    if (row.node->group >= 0) {
      const GroupConfig& g = suite.groups[size_t(row.node->group)];
      const GroupResult& gr = groups[size_t(row.node->group)];
      const std::string name = indent(row.depth) + g.alias, ver = version_text(g.version);
      metric_rows(rows, name, ver, "", gr.metrics);
      if (g.aggregate) metric_rows(group_rows, name, ver, "", gr.metrics);
      continue;
    }
    const TaskConfig& c = suite.tasks[size_t(row.node->task)];
    const TaskResult& r = results[size_t(row.node->task)];
    metric_rows(rows, indent(row.depth) + c.alias, version_text(c.version),
                fmt::format("{}", r.num_fewshot), r.metrics);
  }
  std::string out = markdown(rows);
  if (group_rows.size() > 1) out += "\n" + markdown(group_rows);
  return out;
}

}  // namespace nk
