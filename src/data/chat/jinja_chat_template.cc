#include "data/chat/jinja_chat_template.h"

#include <algorithm>

#include "core/error.h"
#include "core/strings.h"

namespace nk {
namespace {

using ojson = nlohmann::ordered_json;

// End-of-turn markers of the common families, besides the tokenizer's eos.
constexpr const char* kEndMarkers[] = {
    "<|im_end|>",      "<|eot_id|>",
    "<|eom_id|>",      "<|end|>",
    "<end_of_turn>",   "</s>",
    "<|endoftext|>",   "<|end_of_text|>",
    "<|EOT|>",         "<|END_OF_TURN_TOKEN|>",
    "<|end_of_turn|>", "<｜end▁of▁sentence｜>",
    "<|return|>",
};

// The earliest end-of-turn marker in text[from, to): its end, or npos.
size_t end_of_turn(const std::string& text, size_t from, size_t to, const std::string& eos) {
  size_t best = std::string::npos, best_end = std::string::npos;
  auto consider = [&](const std::string& m) {
    if (m.empty()) return;
    const size_t at = text.find(m, from);
    if (at == std::string::npos || at + m.size() > to) return;
    if (best == std::string::npos || at < best || (at == best && at + m.size() > best_end))
      best = at, best_end = at + m.size();
  };
  consider(eos);
  for (const char* m : kEndMarkers) consider(m);
  return best_end;
}

std::vector<ChatMessage> head(const std::vector<ChatMessage>& m, size_t n) {
  return std::vector<ChatMessage>(m.begin(), m.begin() + ptrdiff_t(n));
}

}  // namespace

ojson chat_messages_json(const std::vector<ChatMessage>& messages) {
  ojson out = ojson::array();
  for (const ChatMessage& m : messages) {
    ojson o = {{"role", m.role}, {"content", m.content}};
    if (m.extra.is_object())
      for (auto it = m.extra.begin(); it != m.extra.end(); ++it) o[it.key()] = it.value();
    out.push_back(std::move(o));
  }
  return out;
}

JinjaChatTemplate::JinjaChatTemplate(
    const std::vector<std::pair<std::string, std::string>>& sources, const std::string& origin)
    : origin_(origin) {
  for (const auto& [name, source] : sources) {
    const std::string where = name.empty() ? origin : origin + " (" + name + ")";
    auto t = std::make_unique<jinja::Template>(source, where);
    if (name.empty() || name == "default")
      default_ = std::move(t);
    else if (name == "tool_use")
      tool_use_ = std::move(t);
  }
  if (!default_ && !tool_use_)
    fail("{}: no chat template named \"default\" (or \"tool_use\") in its list", origin);
}

std::string JinjaChatTemplate::jinja() const {
  return default_ ? default_->source() : tool_use_->source();
}

const jinja::Template& JinjaChatTemplate::pick(const ojson& tools) const {
  if (!tools.is_null() && tool_use_) return *tool_use_;
  if (!default_) fail("{}: has only a \"tool_use\" chat template, and no tools are given", origin_);
  return *default_;
}

std::string JinjaChatTemplate::render_text(const std::vector<ChatMessage>& messages,
                                           const ChatSpecials& specials, bool gen,
                                           const ojson& tools) const {
  ojson ctx;
  ctx["messages"] = chat_messages_json(messages);
  ctx["tools"] = tools;
  ctx["add_generation_prompt"] = gen;
  ctx["bos_token"] = specials.bos;
  ctx["eos_token"] = specials.eos;
  for (const auto& [k, v] : specials.more) ctx[k] = v;
  return pick(tools).render(ctx);
}

std::vector<ChatSegment> JinjaChatTemplate::render_impl(const std::vector<ChatMessage>& m,
                                                        const ChatSpecials& specials, bool gen,
                                                        const ojson& tools) const {
  const std::string full = render_text(m, specials, gen, tools);
  if (gen) return {{full, false}};
  std::vector<ChatSegment> segs;
  auto add = [&](size_t from, size_t to, bool trained) {
    if (to > from) segs.push_back({full.substr(from, to - from), trained});
  };
  size_t at = 0;  // full[0, at) is in segs
  for (size_t i = 0; i < m.size(); ++i) {
    if (m[i].role != "assistant") continue;
    const std::vector<ChatMessage> prior = head(m, i);
    std::string before;
    try {
      before = render_text(prior, specials, true, tools);
    } catch (const Error& e) {
      fail(
          "{}: messages[{}] (assistant): the conversation before it, rendered with the generation "
          "prompt (to find where the answer starts), fails: {}",
          origin_, i, e.what());
    }
    size_t start = before.size();
    if (!full.starts_with(before)) {
      // A template may write something before the first turn only once
      // there is one (Llama 3's bos): then the answer starts after the
      // generation prompt's own text, found after the render without it.
      start = std::string::npos;
      std::string bare;
      try {
        bare = render_text(prior, specials, false, tools);
      } catch (const Error&) {
      }
      if (full.starts_with(bare) && before.starts_with(bare) && before.size() > bare.size()) {
        const std::string prompt = before.substr(bare.size());
        const size_t p = full.find(prompt, bare.size());
        if (p != std::string::npos) start = p + prompt.size();
      }
    }
    if (start == std::string::npos || start < at)
      fail(
          "{}: messages[{}] (assistant): the template renders the messages before it (with the "
          "generation prompt) as a text that does not begin the whole conversation's text, so "
          "the answer cannot be told apart for training (the template changes earlier turns as "
          "the conversation goes on)",
          origin_, i);
    size_t bound = full.size();
    try {
      const std::string upto = render_text(head(m, i + 1), specials, false, tools);
      if (full.starts_with(upto) && upto.size() > start) bound = upto.size();
    } catch (const Error&) {
      // A conversation the template refuses to end here: search the whole text.
    }
    // The content as the template writes it (often trimmed), then the
    // first end-of-turn marker after it.
    size_t from = start;
    const std::string content(trim(m[i].content));
    if (!content.empty()) {
      const size_t c = full.find(content, start);
      if (c != std::string::npos && c + content.size() <= bound) from = c + content.size();
    }
    const size_t end = end_of_turn(full, from, bound, specials.eos);
    if (end == std::string::npos)
      fail(
          "{}: messages[{}] (assistant): no end-of-turn marker (the eos '{}', <|im_end|>, "
          "<|eot_id|>, <end_of_turn>, <|end|>, </s>, ...) after its content, so training would "
          "not teach the model to stop",
          origin_, i, specials.eos);
    add(at, start, false);
    add(start, end, true);
    at = end;
  }
  add(at, full.size(), false);
  return segs;
}

}  // namespace nk
