// A model's own chat template: its Jinja source rendered as Hugging Face's
// apply_chat_template renders it (data/jinja), with
//   messages               [{role, content, and the message's other keys}]
//   tools                  OpenAI's tool list, or null
//   add_generation_prompt
//   bos_token, eos_token   and the other special tokens tokenizer_config.json
//                          names (ChatSpecials::more)
// Hugging Face's list form (several named templates) renders "tool_use" when
// tools are given and it exists, else "default".
//
// What fine-tuning trains on comes from renders of the conversation's
// prefixes, as the template defines no segments. For assistant message i:
//   P = render(messages[:i], add_generation_prompt=true) must begin the
//       whole conversation's render F, and the answer starts at |P|; or,
//       for a template that writes something only once a turn exists
//       (Llama 3's bos before the first header), the generation prompt's own
//       text (P less the render without it, B) is found in F after |B| and
//       the answer starts after it; else the turn cannot be told apart: an
//       error naming messages[i];
//   the trained span runs from there to the end of the first
//       end-of-turn marker after the message's content (eos, or one of the
//       families' markers: <|im_end|>, <|eot_id|>, <|eom_id|>, <|end|>,
//       <end_of_turn>, </s>, ...), searched no further than the end of
//       render(messages[:i+1]) when that begins F too.
// So a template that drops earlier reasoning (Qwen3) still trains each turn
// as the whole conversation shows it. On the built-ins' published sources
// this gives exactly the built-ins' segments (tests/data/chat).
//
// With add_generation_prompt (serving) the text comes back as one untrained
// segment: nothing trains on a prompt, and one render is enough.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/chat/chat_template.h"
#include "data/jinja/template.h"

namespace nk {

class JinjaChatTemplate final : public ChatTemplate {
 public:
  // (name, source) pairs: one unnamed source, or Hugging Face's named list,
  // which must hold "default" (or only "tool_use"). `origin` names where the
  // source came from (a file), in name() and messages. nk::Error for a
  // syntax error, naming origin, line and column.
  JinjaChatTemplate(const std::vector<std::pair<std::string, std::string>>& sources,
                    const std::string& origin);
  std::string name() const override { return "jinja (" + origin_ + ")"; }
  std::string jinja() const override;
  // The rendered text alone (one render).
  std::string render_text(const std::vector<ChatMessage>& messages, const ChatSpecials& specials,
                          bool add_generation_prompt,
                          const nlohmann::ordered_json& tools = nullptr) const;

 protected:
  std::vector<ChatSegment> render_impl(const std::vector<ChatMessage>& messages,
                                       const ChatSpecials& specials, bool add_generation_prompt,
                                       const nlohmann::ordered_json& tools) const override;
  std::string text_impl(const std::vector<ChatMessage>& messages, const ChatSpecials& specials,
                        bool add_generation_prompt,
                        const nlohmann::ordered_json& tools) const override {
    return render_text(messages, specials, add_generation_prompt, tools);
  }

 private:
  const jinja::Template& pick(const nlohmann::ordered_json& tools) const;
  std::string origin_;
  std::unique_ptr<jinja::Template> default_, tool_use_;
};

// The messages as the template sees them: {role, content, extra keys...}.
nlohmann::ordered_json chat_messages_json(const std::vector<ChatMessage>& messages);

}  // namespace nk
