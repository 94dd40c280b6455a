// Task results in lm-evaluation-harness's layout (its results JSON:
// "results" per task with "METRIC,FILTER" and "METRIC_stderr,FILTER" keys,
// "N/A" where no standard error is computed; "configs", "versions",
// "n-shot", "higher_is_better", "n-samples") and its terminal table.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/task_config.h"
#include "eval/task_runner.h"

namespace nk {

nlohmann::ordered_json results_json(const std::vector<TaskConfig>& configs,
                                    const std::vector<TaskResult>& results,
                                    const nlohmann::ordered_json& run_config);

// |Tasks|Version|Filter|n-shot|Metric| |Value| |Stderr| in markdown.
std::string results_table(const std::vector<TaskConfig>& configs,
                          const std::vector<TaskResult>& results);

}  // namespace nk
