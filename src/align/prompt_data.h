// A prompts file (JSONL, plain or zstd) as rejection sampling, SteerLM and
// online RL read it: one record per line whose prompt (under `key`) is a
// string or a list of chat messages, every record of one kind; the whole
// record is kept (online RL's rewards read its other fields, e.g. "answer").
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/json_records.h"

namespace nk {

struct PromptRecords {
  JsonRecords file;
  std::vector<nlohmann::json> prompts;  // each record's prompt, in file order
  bool chat = false;
};

// nk::Error naming `what` (the key that gave the path) or PATH:LINE: KEY for
// an unreadable file, a record without the key, a prompt that is neither a
// string nor messages, or a mix of the two kinds.
PromptRecords read_prompt_records(const std::string& path, const std::string& key,
                                  const char* what = "align.data_path");

}  // namespace nk
