#include "eval/task_group.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <set>

#include "core/error.h"
#include "eval/task_config.h"

namespace nk {

bool is_group_file(const std::string& path) {
  try {
    const YAML::Node root = YAML::LoadFile(path);
    return root.IsMap() && root["group"] && root["task"] && root["task"].IsSequence();
  } catch (const YAML::Exception&) {
    return false;
  }
}

namespace {

// The group a YAML mapping defines (`where`: the file, or the file and the
// entry of an enclosing group's task list).
GroupConfig parse_group(const YAML::Node& root, const std::string& where) {
  GroupConfig g;
  g.file = where;
  auto bad = [&](const std::string& key, const std::string& why) -> void {
    fail("{}: {}: {}", where, key, why);
  };
  auto scalar = [&](const YAML::Node& n, const std::string& key) {
    if (!n.IsScalar()) bad(key, "must be a string");
    return n.Scalar();
  };
  auto boolean = [&](const YAML::Node& n, const std::string& key) {
    const std::string s = scalar(n, key);
    if (s == "true" || s == "True") return true;
    if (s == "false" || s == "False") return false;
    bad(key, fmt::format("must be true or false, got '{}'", s));
    return false;
  };
  if (!root.IsMap()) fail("{}: a group is a mapping of keys (group, task, ...)", where);
  // The harness's GROUP_ONLY_KEYS; the rest go over the tasks below.
  static const std::set<std::string> own = {"group", "group_alias", "task", "aggregate_metric_list",
                                            "metadata"};
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string k = it->first.as<std::string>();
    if (!own.count(k)) g.update[k] = yaml_json(it->second, where + ": " + k);
  }
  if (!root["group"]) bad("group", "missing (the group's name)");
  g.group = scalar(root["group"], "group");
  g.alias = root["group_alias"] ? scalar(root["group_alias"], "group_alias") : g.group;
  if (!root["task"] || !root["task"].IsSequence() || root["task"].size() == 0)
    bad("task", "missing or not a list of task, group or tag names");
  for (size_t i = 0; i < root["task"].size(); ++i) {
    const YAML::Node t = root["task"][i];
    const std::string key = fmt::format("task[{}]", i);
    if (t.IsMap() && t["task"] && t["task"].IsSequence()) {  // a group defined in place
      GroupEntry e;
      e.group = std::make_shared<GroupConfig>(parse_group(t, where + ": " + key));
      g.tasks.push_back(std::move(e));
      continue;
    }
    if (t.IsMap()) {
      GroupEntry e;
      e.config = yaml_json(t, where + ": " + key);
      if (e.config.contains("group"))
        bad(key, "'group' beside a task name: a group defined in place lists its tasks in 'task'");
      if (!e.config.contains("task") || !e.config["task"].is_string())
        bad(key + ".task", "missing (the name of the task it defines or overrides)");
      e.name = e.config["task"].get<std::string>();
      g.tasks.push_back(std::move(e));
      continue;
    }
    g.tasks.push_back({scalar(t, key), nullptr, nullptr});
  }
  if (const YAML::Node agg = root["aggregate_metric_list"]; agg && !agg.IsNull()) {
    if (!agg.IsSequence()) bad("aggregate_metric_list", "must be a list");
    g.aggregate.emplace();
    for (size_t i = 0; i < agg.size(); ++i) {
      const std::string key = fmt::format("aggregate_metric_list[{}]", i);
      const YAML::Node m = agg[i];
      if (!m.IsMap()) bad(key, "must be a mapping (metric, aggregation, weight_by_size, ...)");
      AggregateMetric a;
      for (auto it = m.begin(); it != m.end(); ++it) {
        const std::string k = it->first.as<std::string>();
        const std::string where = key + "." + k;
        if (k == "metric") {
          a.metric = scalar(it->second, where);
        } else if (k == "aggregation") {
          const std::string v = scalar(it->second, where);
          if (v != "mean") bad(where, fmt::format("'{}': only mean aggregates a group's tasks", v));
        } else if (k == "weight_by_size") {
          a.weight_by_size = boolean(it->second, where);
        } else if (k == "filter_list") {
          a.filters.clear();
          if (it->second.IsSequence()) {
            for (size_t f = 0; f < it->second.size(); ++f)
              a.filters.push_back(scalar(it->second[f], fmt::format("{}[{}]", where, f)));
          } else {
            a.filters.push_back(scalar(it->second, where));
          }
        } else {
          bad(where, "unknown key (known: metric, aggregation, weight_by_size, filter_list)");
        }
      }
      if (a.metric.empty()) bad(key + ".metric", "missing");
      g.aggregate->push_back(std::move(a));
    }
  }
  if (const YAML::Node md = root["metadata"]; md && md.IsMap() && md["version"]) {
    const std::string v = scalar(md["version"], "metadata.version");
    try {
      g.version = std::stod(v);
    } catch (const std::exception&) {
      g.version = v;
    }
  }
  return g;
}

}  // namespace

GroupConfig load_group_config(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    fail("{}: cannot read the group file", path);
  } catch (const YAML::Exception& e) {
    fail("{}:{}:{}: malformed YAML: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  return parse_group(root, path);
}

Pooled aggregate_metric(const std::vector<double>& values,
                        const std::vector<std::optional<double>>& stderrs,
                        const std::vector<int64_t>& sizes, bool weight_by_size) {
  Pooled p;
  double num = 0, den = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double w = weight_by_size ? double(sizes[i]) : 1.0;
    num += values[i] * w;
    den += w;
  }
  p.value = num / den;
  double n = 0, var = 0;
  for (size_t i = 0; i < stderrs.size(); ++i) {
    if (!stderrs[i]) return p;  // "N/A"
    var += double(sizes[i] - 1) * *stderrs[i] * *stderrs[i] * double(sizes[i]);
    n += double(sizes[i]);
  }
  const double dof = n - double(stderrs.size());
  if (dof > 0) p.stderr_ = std::sqrt(var / dof / n);
  return p;
}

}  // namespace nk
