// The records of a JSONL file (plain or zstd) that rejection sampling and
// SteerLM read, each with its line, before anything is generated or written.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace nk {

struct JsonRecord {
  int64_t line = 0;
  nlohmann::json value;  // an object
};

struct JsonRecords {
  std::string path;
  std::vector<JsonRecord> records;
  // "PATH:LINE"
  std::string where(const JsonRecord& r) const;
  // "PATH:LINE: KEY"
  std::string where(const JsonRecord& r, const std::string& key) const;
};

// Every non-blank line of `path` as a JSON object. nk::Error naming
// PATH:LINE for a line that is not a JSON object, and naming the file when it
// holds none.
JsonRecords read_json_records(const std::string& path);

// rec[key]; nk::Error "PATH:LINE: no \"KEY\"" without it.
const nlohmann::json& record_field(const JsonRecords& f, const JsonRecord& r,
                                   const std::string& key);

}  // namespace nk
