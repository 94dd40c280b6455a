#include "data/chat/chat_config.h"

#include <filesystem>

#include "core/json.h"
#include "data/dataset/text_dataset.h"

namespace nk {

std::string find_model_file(const std::string& model_dir, const std::string& name) {
  namespace fs = std::filesystem;
  if (model_dir.empty()) return "";
  for (const fs::path& p : {fs::path(model_dir) / name, fs::path(model_dir) / "tokenizer" / name})
    if (fs::is_regular_file(p)) return p.string();
  return "";
}

namespace {

// A template the data may not need: its error is given by the first
// conversational record that does.
class MissingTemplate : public ChatTemplate {
 public:
  explicit MissingTemplate(std::string why) : why_(std::move(why)) {}
  std::string name() const override { return "(none)"; }
  std::string jinja() const override { return ""; }

 protected:
  std::vector<ChatSegment> render_impl(const std::vector<ChatMessage>&, const ChatSpecials&, bool,
                                       const nlohmann::ordered_json&) const override {
    fail("{}", why_);
  }

 private:
  std::string why_;
};

}  // namespace

std::shared_ptr<const ChatTemplate> chat_template_if_any(const std::string& name,
                                                         const std::string& model_dir,
                                                         const std::string& key) {
  try {
    return chat_template_for(name, model_dir);
  } catch (const Error& e) {
    return std::make_shared<MissingTemplate>(
        fmt::format("a chat record needs a template: {}: {}", key, e.what()));
  }
}

ChatSpecials chat_specials(const Tokenizer& tok, const std::string& model_dir) {
  ChatSpecials s;
  if (tok.eod_id() >= 0) s.eos = tok.token_bytes(tok.eod_id());
  for (const auto& [text, id] : tok.special_tokens())
    if (text == "<s>" || text == "<bos>" || text == "<|begin_of_text|>") s.bos = text;
  const std::string path = find_model_file(model_dir, "tokenizer_config.json");
  if (path.empty()) return s;
  const nlohmann::json j = parse_json_object(read_text_file(path), path);
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token",
                          "cls_token", "mask_token"}) {
    const auto it = j.find(key);
    if (it == j.end()) continue;
    const nlohmann::json& v = it->is_object() && it->contains("content") ? (*it)["content"] : *it;
    if (!v.is_string()) continue;  // null: the tokenizer has none
    const std::string text = v.get<std::string>();
    if (std::string(key) == "bos_token")
      s.bos = text;
    else if (std::string(key) == "eos_token")
      s.eos = text;
    else
      s.more.emplace_back(key, text);
  }
  return s;
}

}  // namespace nk
