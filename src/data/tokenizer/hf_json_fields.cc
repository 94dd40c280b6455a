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

std::array<int32_t, 3> hf_merge_ids(const json& merges, size_t i,
                                    const std::unordered_map<std::string, int32_t>& id_of,
                                    const std::string& file) {
  const json& mj = merges[i];
  std::string a, b;
  if (mj.is_string()) {
    const std::string& s = mj.get_ref<const std::string&>();
    const size_t sp = s.find(' ');
    if (sp != std::string::npos && sp > 0 && sp + 1 < s.size() &&
        s.find(' ', sp + 1) == std::string::npos)
      a = s.substr(0, sp), b = s.substr(sp + 1);
  } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
    a = mj[0].get<std::string>(), b = mj[1].get<std::string>();
  }
  if (a.empty() || b.empty())
    fail("{}: model.merges[{}] must be \"A B\" (two tokens, one space) or [\"A\", \"B\"], got {}",
         file, i, mj.dump());
  const std::string ab = a + b;
  const std::string* parts[3] = {&a, &b, &ab};
  std::array<int32_t, 3> ids{};
  for (int k = 0; k < 3; ++k) {
    auto it = id_of.find(*parts[k]);
    if (it == id_of.end())
      fail("{}: model.merges[{}] ('{} {}'): '{}' is not in model.vocab", file, i, a, b, *parts[k]);
    ids[size_t(k)] = it->second;
  }
  return ids;
}

}  // namespace nk
