// What `eval.tasks` names, resolved: tasks, groups (group YAMLs, nested) and
// tags (a task's `tag:`), as lm-evaluation-harness's TaskManager resolves
// them, and the group scores over their tasks' results.
//
// A name is looked up in the task folder: NAME.yaml (a task or group file),
// else a task, group or tag of that name in any YAML below it, else a
// folder NAME (every task file in it). A tag stands for its tasks, in place
// (no level of its own); a group's children are listed in name order, as
// the harness prints them. A group's inline entries load as the harness's
// TaskManager loads them: the entry's keys (under those of the inline
// entries enclosing it) go over every task of the group or tag it names, or
// over the task it names (renamed NAME-k when its group already overrode k
// tasks whose names start with NAME; its documents still NAME's), or define
// a new task when nothing has its name.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/task_config.h"
#include "eval/task_group.h"
#include "eval/task_runner.h"

namespace nk {

struct SuiteNode {
  int64_t task = -1, group = -1;  // index into TaskSuite::tasks or ::groups
  std::vector<SuiteNode> children;
};

struct TaskSuite {
  std::vector<TaskConfig> tasks;  // each once, in the order they are met
  std::vector<GroupConfig> groups;
  std::vector<SuiteNode> roots;  // as eval.tasks lists them
};

// nk::Error naming the key `what` (eval.tasks, train.eval_tasks) for an
// unknown name, a name defined twice (two files, or a task loaded with two
// different sets of keys), or a group that holds itself.
TaskSuite load_suite(const std::vector<std::string>& names, const std::string& task_dir,
                     const std::string& what = "eval.tasks");

struct GroupResult {
  std::string group;
  int64_t samples = 0;                // Σ of its tasks' scored documents
  std::vector<MetricValue> metrics;   // empty without aggregate_metric_list
  std::vector<std::string> subtasks;  // its direct children, tasks and groups
};

// Every group's scores (results[i] is suite.tasks[i]'s), in suite.groups'
// order. nk::Error naming the group file when an aggregated metric is
// reported by none of its tasks.
std::vector<GroupResult> aggregate_groups(const TaskSuite& suite,
                                          const std::vector<TaskResult>& results);

struct SuiteResult {
  std::vector<TaskResult> tasks;  // suite.tasks' order
  std::vector<GroupResult> groups;
};
// Every task of the suite on `model` (run_task), then the groups.
SuiteResult run_suite(const TaskSuite& suite, EvalModel& model, const TaskRunOptions& opt);

// The scores as flat figures for a training log: "eval/NAME/METRIC" for
// tasks and aggregating groups (".../METRIC/FILTER" for a filter other than
// "none").
std::vector<std::pair<std::string, double>> suite_figures(const TaskSuite& suite,
                                                          const SuiteResult& r);

}  // namespace nk
