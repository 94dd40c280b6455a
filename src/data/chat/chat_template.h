// Chat templates: a conversation (OpenAI's {"role", "content"} messages) to
// the text a chat model was trained on, split into segments that say which
// characters the fine-tuning loss covers.
//
// A model's own template is its tokenizer_config.json `chat_template` (Jinja),
// rendered as Hugging Face renders it (data/jinja, jinja_chat_template.h),
// with the messages, the tools, add_generation_prompt and the special tokens.
// Built-ins stand in for the common families' published templates and are
// used whenever a model's template is exactly one of them (their segments
// are exact); each renders exactly what its published Jinja renders with
// apply_chat_template, including the template's own refusals (roles out of
// order, a system message where the family has none); the tests check every
// one against @huggingface/jinja. Names:
//   chatml   <|im_start|>ROLE\nCONTENT<|im_end|>\n (Qwen, OpenHermes, ...)
//   llama3   Meta-Llama-3-8B-Instruct: <|start_header_id|>ROLE<|end_header_id|>\n\n...
//   llama2   Llama-2-chat: [INST] with a <<SYS>> block in the first turn
//   mistral  Mistral-7B-Instruct: [INST] ... [/INST]ANSWER</s>, no system role
//   gemma    Gemma-it: <start_of_turn>user / model, no system role
//   phi3     Phi-3-mini-instruct: <|system|>, <|user|>, <|assistant|>, <|end|>
//   plain    no markup: the contents one after the other, each answer ended by
//            eos (NeMo's prompt/answer samples: input then output)
// What the loss covers ("trained" segments): each assistant message's content
// as the template writes it and the end-of-turn marker that follows it
// (<|im_end|>, <|eot_id|>, eos, <end_of_turn>, <|end|>), so the model learns to
// stop; never the role headers, the system or user text, or the separators
// after the end-of-turn marker. (A Jinja template's are derived from renders
// of the conversation's prefixes: jinja_chat_template.h.)
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace nk {

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string role, std::string content, nlohmann::ordered_json extra = nullptr)
      : role(std::move(role)), content(std::move(content)), extra(std::move(extra)) {}
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  // The message's other keys as given (tool_calls, tool_call_id, name, ...),
  // which a Jinja template sees beside role and content; a key "content"
  // here replaces it (null: an assistant message with only tool calls).
  nlohmann::ordered_json extra;
};

struct ChatSegment {
  std::string text;
  bool trained = false;  // the loss covers this text's tokens
};

// The special-token strings the templates write (the tokenizer's own).
struct ChatSpecials {
  ChatSpecials() = default;
  ChatSpecials(std::string bos, std::string eos) : bos(std::move(bos)), eos(std::move(eos)) {}
  std::string bos, eos;
  // Other special tokens a Jinja template may name (unk_token, pad_token,
  // ...: tokenizer_config.json's), as (variable, text).
  std::vector<std::pair<std::string, std::string>> more;
};

class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;
  virtual std::string name() const = 0;
  // The published Jinja source this template renders like ("" for plain).
  virtual std::string jinja() const = 0;
  // nk::Error, with the template's own message, for a conversation the
  // published template refuses. add_generation_prompt: end with the
  // assistant header, as for generation. tools: OpenAI's tool list (null:
  // none), which only a Jinja template shows.
  std::vector<ChatSegment> render(const std::vector<ChatMessage>& messages,
                                  const ChatSpecials& specials, bool add_generation_prompt,
                                  const nlohmann::ordered_json& tools = nullptr) const {
    return render_impl(messages, specials, add_generation_prompt, tools);
  }
  // The rendered text alone, for inference (serving, evaluation): what
  // chat_text(render(...)) gives, without finding the trained spans (so a
  // Jinja template whose answers end in no known end-of-turn marker still
  // renders a conversation that ends in one).
  std::string text(const std::vector<ChatMessage>& messages, const ChatSpecials& specials,
                   bool add_generation_prompt,
                   const nlohmann::ordered_json& tools = nullptr) const {
    return text_impl(messages, specials, add_generation_prompt, tools);
  }

 protected:
  virtual std::string text_impl(const std::vector<ChatMessage>& messages,
                                const ChatSpecials& specials, bool add_generation_prompt,
                                const nlohmann::ordered_json& tools) const;
  virtual std::vector<ChatSegment> render_impl(const std::vector<ChatMessage>& messages,
                                               const ChatSpecials& specials,
                                               bool add_generation_prompt,
                                               const nlohmann::ordered_json& tools) const = 0;
};

// The built-in named `name`; nk::Error listing the names otherwise.
const ChatTemplate& find_chat_template(const std::string& name);
std::vector<std::string> chat_template_names();

// The built-in whose published Jinja source is `jinja` (a tokenizer_config.json
// `chat_template`; compared ignoring white space between tags), or nullptr.
const ChatTemplate* match_chat_template(const std::string& jinja);

// The template for Jinja source `jinja` (`origin` names where it came from,
// for messages): the built-in it is exactly, else the Jinja template itself.
// nk::Error for a syntax error, naming origin, line and column.
std::shared_ptr<const ChatTemplate> chat_template_from_jinja(const std::string& jinja,
                                                             const std::string& origin);

// The template data.chat_template / serve.chat_template names:
//   a built-in's name      that built-in;
//   a FILE.jinja           the Jinja in that file (a built-in if it is one);
//   "auto" (or "")         the model folder's own: a chat_template.jinja in
//                          DIR or DIR/tokenizer (it takes precedence, as in
//                          transformers), else the chat_template of
//                          DIR/tokenizer_config.json or, as `nekton import hf`
//                          lays a model out, DIR/tokenizer/tokenizer_config.json
//                          (a string, or Hugging Face's list of {name,
//                          template}: "default", and "tool_use" when tools are
//                          given); a built-in when it is exactly one.
// nk::Error naming the file when there is none or it is malformed, listing
// the names: never a silent fallback.
std::shared_ptr<const ChatTemplate> chat_template_for(const std::string& name,
                                                      const std::string& model_dir);

// The segments' text, concatenated: what the published template renders.
std::string chat_text(const std::vector<ChatSegment>& segments);

// transformers' continue_final_message: `text`, the conversation rendered
// without a generation prompt (ChatTemplate::text), cut right after its final
// message's content, so the model goes on with that message (an assistant
// turn opened by a prefix) instead of reading it closed. As
// apply_chat_template cuts: at the last occurrence of the content stripped of
// white space, keeping its trailing white space where the template kept it.
// nk::Error when the content does not appear (the template rewrote it) or the
// conversation is empty.
std::string continue_final_message(const std::string& text,
                                   const std::vector<ChatMessage>& messages);

}  // namespace nk
