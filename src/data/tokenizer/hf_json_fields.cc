#include "data/tokenizer/hf_json_fields.h"

#include "core/error.h"

namespace nk {

using nlohmann::json;

std::string hf_key_at(const std::string& where, const char* key) {
  return where.empty() ? key : where + "." + key;
}

std::string hf_type_of(const json& obj, const std::string& where, const std::string& file) {
  if (!obj.is_object()) fail("{}: {} must be an object, got {}", file, where, obj.dump());
  const json& t = json_member(obj, "type");
  if (!t.is_string()) fail("{}: {}.type must be a string, got {}", file, where, t.dump());
  return t.get<std::string>();
}

bool hf_flag(const json& obj, const char* key, bool absent, const std::string& where,
             const std::string& file) {
  const json& v = json_member(obj, key);
  if (v.is_null()) return absent;
  if (!v.is_boolean())
    fail("{}: {} must be true or false, got {}", file, hf_key_at(where, key), v.dump());
  return v.get<bool>();
}

std::string hf_text(const json& obj, const char* key, const std::string& absent,
                    const std::string& where, const std::string& file) {
  const json& v = json_member(obj, key);
  if (v.is_null()) return absent;
  if (!v.is_string())
    fail("{}: {} must be a string, got {}", file, hf_key_at(where, key), v.dump());
  return v.get<std::string>();
}

}  // namespace nk
