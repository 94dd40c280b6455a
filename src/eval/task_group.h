// A group of tasks as lm-evaluation-harness's group YAML defines one (its
// GroupConfig): `group` (the name), `group_alias`, `task` (the names of
// tasks, groups or tags it holds, or inline definitions: a mapping with a
// `task` name and other task keys, which overrides those keys of the task
// or group of that name, or defines a new task when no task has the name;
// or a group defined in place, a mapping with `group` and a `task` list),
// `aggregate_metric_list` and `metadata.version`; any other key is a task
// key the group puts over every task below it (a named group's under the
// keys an enclosing inline entry puts over it; an inline group's alone, as
// the harness 0.4.9's TaskManager drops the enclosing keys there). A group
// with an aggregate_metric_list scores each
// listed metric over every task below it (subgroups flattened, as the
// harness's consolidate_group_results collects them):
//
//   value  = Σ m_i n_i / Σ n_i   (weight_by_size; else the plain mean of m_i)
//   stderr = sqrt(Σ (n_i - 1) se_i² n_i / (Σ n_i - k) / Σ n_i)   (pooled; "N/A"
//            when any task's is)
//
// over the k tasks that report the metric, n_i their scored documents.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace nk {

// One entry of aggregate_metric_list (the harness's AggMetricConfig).
struct AggregateMetric {
  std::string metric;
  bool weight_by_size = false;                  // the harness's default
  std::vector<std::string> filters = {"none"};  // filter_list
};

struct GroupConfig;

// One entry of a group's task list: a name, an inline task entry, or an
// inline group definition (a mapping with `group` and a `task` list).
struct GroupEntry {
  std::string name;                    // the task, group or tag; an inline one's `task`
  nlohmann::ordered_json config;       // an inline one's keys (read_yaml_json's form); else null
  std::shared_ptr<GroupConfig> group;  // an inline group (name and config empty)
};

struct GroupConfig {
  std::string file, group, alias;  // alias: group_alias, else group
  std::vector<GroupEntry> tasks;   // as the YAML lists them
  // Its other keys (task keys: num_fewshot, description, ...), which the
  // harness puts over every task below it (_process_group_config); null
  // when none.
  nlohmann::ordered_json update;
  // nullopt: no aggregate_metric_list (a group that only gathers tasks).
  std::optional<std::vector<AggregateMetric>> aggregate;
  nlohmann::ordered_json version;  // metadata.version, or null
};

// Whether a YAML file is a group (it has a top-level `group` key with a
// `task` list); false for a task file or one that does not parse.
bool is_group_file(const std::string& path);

// Reads a group YAML (and the groups defined inline in it). nk::Error naming
// the file and key for malformed YAML, a missing group or task list, an
// inline entry without a task name, or an aggregation other than mean.
GroupConfig load_group_config(const std::string& path);

// One metric of a group over its tasks' values, standard errors (nullopt:
// "N/A") and sizes, as above.
struct Pooled {
  double value = 0;
  std::optional<double> stderr_;
};
Pooled aggregate_metric(const std::vector<double>& values,
                        const std::vector<std::optional<double>>& stderrs,
                        const std::vector<int64_t>& sizes, bool weight_by_size);

}  // namespace nk
