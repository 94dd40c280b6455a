#include "eval/task_docs.h"

#include <filesystem>

#include "core/error.h"
#include "data/jsonl_reader.h"

namespace nk {

std::string split_file(const TaskConfig& c, const std::string& data_dir, const std::string& split) {
  namespace fs = std::filesystem;
  auto it = c.data_files.find(split);
  const fs::path rel =
      it != c.data_files.end() ? fs::path(it->second) : fs::path(c.data_name) / (split + ".jsonl");
  return rel.is_absolute() ? rel.string() : (fs::path(data_dir) / rel).string();
}

TaskDocs load_split(const TaskConfig& c, const std::string& data_dir, const std::string& split) {
  TaskDocs out;
  out.file = split_file(c, data_dir, split);
  if (!std::filesystem::is_regular_file(out.file))
    fail(
        "{}: task {}: split '{}': no data file '{}' (eval.data names the folder holding "
        "TASK/SPLIT.jsonl)",
        c.file, c.task, split, out.file);
  JsonlReader reader(out.file);
  std::string_view line;
  int64_t no = 0;
  while (reader.read_line(line, no)) {
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("{}:{}: not valid JSON: {}", out.file, no, e.what());
    }
    if (!j.is_object()) fail("{}:{}: a document must be a JSON object", out.file, no);
    out.docs.push_back(std::move(j));
  }
  if (out.docs.empty()) fail("{}: no documents", out.file);
  return out;
}

}  // namespace nk
