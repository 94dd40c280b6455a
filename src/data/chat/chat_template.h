// Chat templates: a conversation (OpenAI's {"role", "content"} messages) to
// the text a chat model was trained on, split into segments that say which
// characters the fine-tuning loss covers.
//
// Each built-in renders exactly what the model family's published Jinja
// template (its tokenizer_config.json `chat_template`) renders with Hugging
// Face's apply_chat_template, including the template's own refusals (roles
// out of order, a system message where the family has none); the tests check
// every one against @huggingface/jinja. Names:
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
// after the end-of-turn marker.
#pragma once
#include <string>
#include <vector>

namespace nk {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

struct ChatSegment {
  std::string text;
  bool trained = false;  // the loss covers this text's tokens
};

// The special-token strings the templates write (the tokenizer's own).
struct ChatSpecials {
  std::string bos, eos;
};

class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;
  virtual std::string name() const = 0;
  // The published Jinja source this template renders like ("" for plain).
  virtual std::string jinja() const = 0;
  // nk::Error, with the template's own message, for a conversation the
  // published template refuses. add_generation_prompt: end with the
  // assistant header, as for generation.
  virtual std::vector<ChatSegment> render(const std::vector<ChatMessage>& messages,
                                          const ChatSpecials& specials,
                                          bool add_generation_prompt) const = 0;
};

// The built-in named `name`; nk::Error listing the names otherwise.
const ChatTemplate& find_chat_template(const std::string& name);
std::vector<std::string> chat_template_names();

// The built-in whose published Jinja source is `jinja` (a tokenizer_config.json
// `chat_template`; compared ignoring white space between tags), or nullptr.
const ChatTemplate* match_chat_template(const std::string& jinja);

// The template for a model folder: `name` if not empty or "auto"; otherwise
// the one matching DIR/tokenizer_config.json's chat_template, nk::Error when
// the file has none or an unknown one (naming the file and listing the names:
// never a silent fallback).
const ChatTemplate& chat_template_for(const std::string& name, const std::string& model_dir);

// The segments' text, concatenated: what the published template renders.
std::string chat_text(const std::vector<ChatSegment>& segments);

}  // namespace nk
