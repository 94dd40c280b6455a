#include "align/prompt_records.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/json.h"
#include "data/jsonl_reader.h"

namespace nk {

std::string JsonRecords::where(const JsonRecord& r) const {
  return fmt::format("{}:{}", path, r.line);
}

std::string JsonRecords::where(const JsonRecord& r, const std::string& key) const {
  return fmt::format("{}:{}: {}", path, r.line, key);
}

JsonRecords read_json_records(const std::string& path) {
  JsonRecords f;
  f.path = path;
  JsonlReader reader(path);
  std::string_view line;
  int64_t line_no = 0;
  while (reader.read_line(line, line_no)) {
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = fmt::format("{}:{}", path, line_no);
    nlohmann::json rec = parse_json(std::string(line), where);
    if (!rec.is_object()) fail("{}: a record must be a JSON object", where);
    f.records.push_back({line_no, std::move(rec)});
  }
  if (f.records.empty()) fail("{}: no record (the file is empty)", path);
  return f;
}

const nlohmann::json& record_field(const JsonRecords& f, const JsonRecord& r,
                                   const std::string& key) {
  const auto it = r.value.find(key);
  if (it == r.value.end()) fail("{}: no \"{}\"", f.where(r), key);
  return *it;
}

}  // namespace nk
