#include "align/prompt_data.h"

#include "align/preference_data.h"
#include "core/error.h"

namespace nk {

PromptRecords read_prompt_records(const std::string& path, const std::string& key,
                                  const char* what) {
  PromptRecords p;
  try {
    p.file = read_json_records(path);
  } catch (const Error& e) {
    throw e.with_context(what);
  }
  for (const JsonRecord& r : p.file.records) {
    const nlohmann::json& v = record_field(p.file, r, key);
    const bool chat = is_chat_prompt(v, p.file.where(r, key));
    if (p.prompts.empty()) p.chat = chat;
    if (chat != p.chat)
      fail("{}: a {} prompt where {} holds {}: a prompts file holds one kind", p.file.where(r, key),
           chat ? "chat" : "string", p.file.where(p.file.records[0], key),
           p.chat ? "chat messages" : "a string");
    p.prompts.push_back(v);
  }
  return p;
}

}  // namespace nk
