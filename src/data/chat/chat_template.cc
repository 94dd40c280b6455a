#include "data/chat/chat_template.h"

#include <cctype>
#include <filesystem>
#include <memory>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "core/strings.h"
#include "data/chat/chat_config.h"
#include "data/chat/jinja_chat_template.h"
#include "data/dataset/text_dataset.h"

namespace nk {
namespace {

// Segments under construction.
struct Out {
  std::vector<ChatSegment> segs;
  void text(const std::string& t) { add(t, false); }
  void trained(const std::string& t) { add(t, true); }
  void add(const std::string& t, bool trained) {
    if (t.empty()) return;
    if (!segs.empty() && segs.back().trained == trained)
      segs.back().text += t;
    else
      segs.push_back({t, trained});
  }
};

// A built-in: the published template's segments, computed directly. Extra
// message keys mean nothing to the published templates, but a null content
// (an assistant turn of only tool calls) is an error in all of them.
class BuiltIn : public ChatTemplate {
 protected:
  virtual std::vector<ChatSegment> segments(const std::vector<ChatMessage>& m,
                                            const ChatSpecials& s, bool gen) const = 0;
  std::vector<ChatSegment> render_impl(const std::vector<ChatMessage>& m, const ChatSpecials& s,
                                       bool gen, const nlohmann::ordered_json&) const final {
    for (size_t i = 0; i < m.size(); ++i)
      if (m[i].extra.is_object() && m[i].extra.contains("content") &&
          !m[i].extra["content"].is_string())
        fail("chat template {}: message {} has no text content (the template needs one)", name(),
             i + 1);
    return segments(m, s, gen);
  }
};

// The check Llama 2, Mistral and Gemma's templates share.
void require_alternation(const std::vector<ChatMessage>& m, size_t first) {
  for (size_t i = first; i < m.size(); ++i)
    if ((m[i].role == "user") != ((i - first) % 2 == 0))
      fail(
          "chat template: conversation roles must alternate user/assistant/user/assistant/... "
          "(message {} is '{}')",
          i + 1, m[i].role);
}

class ChatML final : public BuiltIn {
 public:
  std::string name() const override { return "chatml"; }
  std::string jinja() const override {
    return R"({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})";
  }

 protected:
  std::vector<ChatSegment> segments(const std::vector<ChatMessage>& m, const ChatSpecials&,
                                    bool gen) const override {
    Out o;
    for (const ChatMessage& x : m) {
      o.text("<|im_start|>" + x.role + "\n");
      o.add(x.content + "<|im_end|>", x.role == "assistant");
      o.text("\n");
    }
    if (gen) o.text("<|im_start|>assistant\n");
    return o.segs;
  }
};

class Llama3 final : public BuiltIn {
 public:
  std::string name() const override { return "llama3"; }
  std::string jinja() const override {
    return R"({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %})";
  }

 protected:
  std::vector<ChatSegment> segments(const std::vector<ChatMessage>& m, const ChatSpecials& s,
                                    bool gen) const override {
    Out o;
    for (size_t i = 0; i < m.size(); ++i) {
      o.text((i == 0 ? s.bos : "") + "<|start_header_id|>" + m[i].role + "<|end_header_id|>\n\n");
      o.add(trim(m[i].content) + "<|eot_id|>", m[i].role == "assistant");
    }
    if (gen) o.text("<|start_header_id|>assistant<|end_header_id|>\n\n");
    return o.segs;
  }
};

class Llama2 final : public BuiltIn {
 public:
  std::string name() const override { return "llama2"; }
  std::string jinja() const override {
    return R"({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %})";
  }

 protected:
  std::vector<ChatSegment> segments(const std::vector<ChatMessage>& m, const ChatSpecials& s,
                                    bool) const override {
    const bool sys = !m.empty() && m[0].role == "system";
    const size_t first = sys ? 1 : 0;
    require_alternation(m, first);
    Out o;
    for (size_t i = first; i < m.size(); ++i) {
      std::string content = m[i].content;
      if (i == first && sys) content = "<<SYS>>\n" + m[0].content + "\n<</SYS>>\n\n" + content;
      if (m[i].role == "user")
        o.text(s.bos + "[INST] " + trim(content) + " [/INST]");
      else if (m[i].role == "assistant")
        o.trained(fmt::format(" {} {}", trim(content), s.eos));
    }
    return o.segs;  // the published template has no generation prompt
  }
};

class Mistral final : public BuiltIn {
 public:
  std::string name() const override { return "mistral"; }
  std::string jinja() const override {
    return R"({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %})";
  }

 protected:
  std::vector<ChatSegment> segments(const std::vector<ChatMessage>& m, const ChatSpecials& s,
                                    bool) const override {
    require_alternation(m, 0);
    Out o;
    o.text(s.bos);
    for (size_t i = 0; i < m.size(); ++i) {
      if (m[i].role == "user")
        o.text("[INST] " + m[i].content + " [/INST]");
      else if (m[i].role == "assistant")
        o.trained(m[i].content + s.eos);
      else
        fail(
            "chat template mistral: only user and assistant roles are supported (message {} is "
            "'{}')",
            i + 1, m[i].role);
    }
    return o.segs;
  }
};

class Gemma final : public BuiltIn {
 public:
  std::string name() const override { return "gemma"; }
  std::string jinja() const override {
    return R"({{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %})";
  }

 protected:
  std::vector<ChatSegment> segments(const std::vector<ChatMessage>& m, const ChatSpecials& s,
                                    bool gen) const override {
    if (!m.empty() && m[0].role == "system")
      fail("chat template gemma: the system role is not supported");
    require_alternation(m, 0);
    Out o;
    o.text(s.bos);
    for (const ChatMessage& x : m) {
      const bool a = x.role == "assistant";
      o.text("<start_of_turn>" + (a ? std::string("model") : x.role) + "\n");
      o.add(trim(x.content) + "<end_of_turn>", a);
      o.text("\n");
    }
    if (gen) o.text("<start_of_turn>model\n");
    return o.segs;
  }
};

class Phi3 final : public BuiltIn {
 public:
  std::string name() const override { return "phi3"; }
  std::string jinja() const override {
    return R"({% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %})";
  }

 protected:
  std::vector<ChatSegment> segments(const std::vector<ChatMessage>& m, const ChatSpecials& s,
                                    bool gen) const override {
    Out o;
    for (const ChatMessage& x : m) {
      if (x.role != "system" && x.role != "user" && x.role != "assistant") continue;
      o.text("<|" + x.role + "|>\n");
      o.add(x.content + "<|end|>", x.role == "assistant");
      o.text("\n");
    }
    o.text(gen ? "<|assistant|>\n" : s.eos);
    return o.segs;
  }
};

class Plain final : public BuiltIn {
 public:
  std::string name() const override { return "plain"; }
  // The same in Jinja, kept with a model tuned on it (chat_template.jinja).
  std::string jinja() const override {
    return "{% for message in messages %}{{ message['content'] }}"
           "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}";
  }

 protected:
  std::vector<ChatSegment> segments(const std::vector<ChatMessage>& m, const ChatSpecials& s,
                                    bool) const override {
    Out o;
    for (const ChatMessage& x : m) {
      if (x.role == "assistant")
        o.trained(x.content + s.eos);
      else
        o.text(x.content);
    }
    return o.segs;
  }
};

const std::vector<std::unique_ptr<ChatTemplate>>& templates() {
  static const auto all = [] {
    std::vector<std::unique_ptr<ChatTemplate>> v;
    v.push_back(std::make_unique<ChatML>());
    v.push_back(std::make_unique<Llama3>());
    v.push_back(std::make_unique<Llama2>());
    v.push_back(std::make_unique<Mistral>());
    v.push_back(std::make_unique<Gemma>());
    v.push_back(std::make_unique<Phi3>());
    v.push_back(std::make_unique<Plain>());
    return v;
  }();
  return all;
}

// A Jinja source without white space, with the escape \n written out as a
// newline counting as white space too: sources that differ only in layout
// (or in '\n' versus a real line break inside a string) compare equal.
std::string squeeze(const std::string& s) {
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == 'n') {
      ++i;
      continue;
    }
    if (!std::isspace(static_cast<unsigned char>(s[i]))) r += s[i];
  }
  return r;
}

}  // namespace

std::vector<std::string> chat_template_names() {
  std::vector<std::string> r;
  for (const auto& t : templates()) r.push_back(t->name());
  return r;
}

const ChatTemplate& find_chat_template(const std::string& name) {
  for (const auto& t : templates())
    if (t->name() == name) return *t;
  fail("unknown chat template '{}' (known: {})", name, fmt::join(chat_template_names(), ", "));
}

const ChatTemplate* match_chat_template(const std::string& jinja) {
  const std::string want = squeeze(jinja);
  for (const auto& t : templates())
    if (!t->jinja().empty() && squeeze(t->jinja()) == want) return t.get();
  return nullptr;
}

std::shared_ptr<const ChatTemplate> chat_template_from_jinja(const std::string& jinja,
                                                             const std::string& origin) {
  if (const ChatTemplate* t = match_chat_template(jinja))
    return std::shared_ptr<const ChatTemplate>(t, [](const ChatTemplate*) {});  // static
  return std::make_shared<JinjaChatTemplate>(
      std::vector<std::pair<std::string, std::string>>{{"", jinja}}, origin);
}

namespace {

// A chat_template.jinja (where newer transformers save the template, and
// nekton finetune the one it trained with), which takes precedence over
// tokenizer_config.json's chat_template as in transformers' from_pretrained;
// else that chat_template (a string or a list of {name, template}); null
// when neither.
std::shared_ptr<const ChatTemplate> model_chat_template(const std::string& model_dir,
                                                        std::string& looked_in) {
  const std::string file = find_model_file(model_dir, "chat_template.jinja");
  if (!file.empty()) return chat_template_from_jinja(read_text_file(file), file);
  const std::string config = find_model_file(model_dir, "tokenizer_config.json");
  looked_in = config.empty()
                  ? fmt::format(
                        "neither {0}/tokenizer_config.json nor "
                        "{0}/tokenizer/tokenizer_config.json exists, nor a "
                        "chat_template.jinja",
                        model_dir)
                  : config + " has no chat_template (nor is there a chat_template.jinja)";
  if (!config.empty()) {
    const nlohmann::json j = parse_json_object(read_text_file(config), config);
    const auto it = j.find("chat_template");
    if (it != j.end() && it->is_string())
      return chat_template_from_jinja(it->get<std::string>(), config + " chat_template");
    if (it != j.end() && it->is_array()) {
      std::vector<std::pair<std::string, std::string>> named;
      for (size_t k = 0; k < it->size(); ++k) {
        const nlohmann::json& e = (*it)[k];
        if (!e.is_object() || !e.contains("name") || !e["name"].is_string() ||
            !e.contains("template") || !e["template"].is_string())
          fail("{}: chat_template[{}] must be {{\"name\": NAME, \"template\": JINJA}}", config, k);
        named.emplace_back(e["name"].get<std::string>(), e["template"].get<std::string>());
      }
      if (named.size() == 1 && named[0].first == "default")
        return chat_template_from_jinja(named[0].second, config + " chat_template");
      return std::make_shared<JinjaChatTemplate>(named, config + " chat_template");
    }
    if (it != j.end() && !it->is_null())
      fail("{}: chat_template must be a string or a list of {{name, template}}, not {}", config,
           it->type_name());
  }
  return nullptr;
}

}  // namespace

std::shared_ptr<const ChatTemplate> chat_template_for(const std::string& name,
                                                      const std::string& model_dir) {
  const std::string names =
      fmt::format("{}, auto, or a .jinja file", fmt::join(chat_template_names(), ", "));
  if (!name.empty() && name != "auto") {
    for (const auto& t : templates())
      if (t->name() == name)
        return std::shared_ptr<const ChatTemplate>(t.get(), [](const ChatTemplate*) {});
    if (std::filesystem::is_regular_file(name))
      return chat_template_from_jinja(read_text_file(name), name);
    if (name.ends_with(".jinja")) fail("chat template file '{}' does not exist", name);
    fail("unknown chat template '{}' (known: {})", name, names);
  }
  if (model_dir.empty())
    fail(
        "chat template 'auto' reads the model's tokenizer_config.json, but no model folder is "
        "given; name one of {}",
        names);
  std::string looked_in;
  if (auto t = model_chat_template(model_dir, looked_in)) return t;
  fail("chat template 'auto': {}; name one of {}", looked_in, names);
}

std::string chat_text(const std::vector<ChatSegment>& segments) {
  std::string r;
  for (const ChatSegment& s : segments) r += s.text;
  return r;
}

namespace {

// Python's str.strip() white space, for the ASCII a template meets.
bool py_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

std::string_view lstrip(std::string_view s) {
  while (!s.empty() && py_space(s.front())) s.remove_prefix(1);
  return s;
}

std::string_view strip(std::string_view s) {
  s = lstrip(s);
  while (!s.empty() && py_space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string ChatTemplate::text_impl(const std::vector<ChatMessage>& messages,
                                    const ChatSpecials& specials, bool add_generation_prompt,
                                    const nlohmann::ordered_json& tools) const {
  return chat_text(render_impl(messages, specials, add_generation_prompt, tools));
}

std::string continue_final_message(const std::string& text,
                                   const std::vector<ChatMessage>& messages) {
  if (messages.empty()) fail("continue_final_message: there is no final message to continue");
  const std::string& final = messages.back().content;
  const std::string_view core = strip(final);
  const size_t at = text.rfind(core);
  if (at == std::string::npos)
    fail(
        "continue_final_message: the final message does not appear in the chat after applying "
        "the chat template (the template rewrites it)");
  // The content as given when it opens with no white space and the template
  // kept it whole, trailing white space included; else up to its last
  // non-space character.
  const bool whole =
      lstrip(final).size() == final.size() && text.compare(at, final.size(), final) == 0;
  return text.substr(0, at + (whole ? final.size() : core.size()));
}

}  // namespace nk
