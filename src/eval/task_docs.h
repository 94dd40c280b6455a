// A task's documents: one JSON object per line of a local JSONL file (plain
// or zstd) per split; no hub access. The file of split S is
// dataset_kwargs.data_files[S] when the task names one (relative to the
// data folder), else DATA/TASK/S.jsonl.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/task_config.h"

namespace nk {

struct TaskDocs {
  std::string file;  // where they were read, for messages
  std::vector<nlohmann::ordered_json> docs;
};

std::string split_file(const TaskConfig& c, const std::string& data_dir, const std::string& split);

// nk::Error naming the file and line for a missing file, a line that is not
// a JSON object, or no documents.
TaskDocs load_split(const TaskConfig& c, const std::string& data_dir, const std::string& split);

}  // namespace nk
