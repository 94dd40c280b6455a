// The typed fields of Hugging Face's tokenizer.json as its readers take them
// (hf_tokenizer_json, hf_spm_json): each a nk::Error naming FILE and the
// JSON path WHERE.KEY when the field has another type.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "core/json.h"

namespace nk {

// `obj`'s "type": nk::Error unless `obj` is an object with a string "type".
std::string hf_type_of(const nlohmann::json& obj, const std::string& where,
                       const std::string& file);
// A boolean member; `absent` when missing or null.
bool hf_flag(const nlohmann::json& obj, const char* key, bool absent, const std::string& where,
             const std::string& file);
// A string member; `absent` when missing or null.
std::string hf_text(const nlohmann::json& obj, const char* key, const std::string& absent,
                    const std::string& where, const std::string& file);
// model.merges[i] ("A B" or ["A", "B"]) as the ids of A, B and AB in
// `id_of`: nk::Error naming FILE and the merge when it has another form or a
// piece is not in model.vocab.
std::array<int32_t, 3> hf_merge_ids(const nlohmann::json& merges, size_t i,
                                    const std::unordered_map<std::string, int32_t>& id_of,
                                    const std::string& file);
// WHERE.KEY, or KEY at the top.
std::string hf_key_at(const std::string& where, const char* key);

}  // namespace nk
