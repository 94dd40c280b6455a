// Task and group results in lm-evaluation-harness's layout (its results
// JSON: "results" per task and group with "METRIC,FILTER" and
// "METRIC_stderr,FILTER" keys, "N/A" where no standard error is computed,
// aliases indented by depth (" - " under a group); "groups" with the
// groups that aggregate; "group_subtasks", "configs", "versions", "n-shot",
// "higher_is_better", "n-samples") and its terminal tables (tasks and
// groups, then the groups alone).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/task_runner.h"
#include "eval/task_suite.h"

namespace nk {

// results[i] is suite.tasks[i]'s; groups[i] suite.groups[i]'s.
nlohmann::ordered_json results_json(const TaskSuite& suite, const std::vector<TaskResult>& results,
                                    const std::vector<GroupResult>& groups,
                                    const nlohmann::ordered_json& run_config);

// |Tasks|Version|Filter|n-shot|Metric| |Value| |Stderr| in markdown, then
// |Groups|...| when a group aggregates.
std::string results_table(const TaskSuite& suite, const std::vector<TaskResult>& results,
                          const std::vector<GroupResult>& groups);

}  // namespace nk
