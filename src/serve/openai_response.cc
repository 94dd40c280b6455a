#include "serve/openai_response.h"

namespace nk {

using json = nlohmann::json;

const char* openai_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::Stop:
    case FinishReason::Eos:
      return "stop";
    case FinishReason::Length:
    case FinishReason::Context:
    case FinishReason::Cancelled:
      return "length";
  }
  return "length";
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

namespace {

json byte_list(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

json null_or(const char* s) {
  return s ? json(s) : json(nullptr);
}

}  // namespace

json chat_logprob_entries(const Tokenizer& tok, const ChoiceOutput& c, size_t from, size_t to) {
  json content = json::array();
  for (size_t i = from; i < to && i < c.tokens.size() && i < c.logprobs.size(); ++i) {
    const std::string t = tok.token_bytes(c.tokens[i]);
    json top = json::array();
    if (i < c.top.size())
      for (const TokenLogprob& x : c.top[i]) {
        const std::string s = tok.token_bytes(x.token);
        top.push_back({{"token", s}, {"logprob", x.logprob}, {"bytes", byte_list(s)}});
      }
    content.push_back(
        {{"token", t}, {"logprob", c.logprobs[i]}, {"bytes", byte_list(t)}, {"top_logprobs", top}});
  }
  return content;
}

json completion_logprobs(const Tokenizer& tok, const ChoiceOutput& c, size_t from, size_t to,
                         size_t offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (size_t i = from; i < to && i < c.tokens.size() && i < c.logprobs.size(); ++i) {
    const std::string t = tok.token_bytes(c.tokens[i]);
    tokens.push_back(t);
    lps.push_back(c.logprobs[i]);
    json top = json::object();
    if (i < c.top.size())
      for (const TokenLogprob& x : c.top[i]) top[tok.token_bytes(x.token)] = x.logprob;
    tops.push_back(top);
    offs.push_back(offset);
    offset += t.size();
  }
  return {
      {"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json prompt_logprobs(const Tokenizer& tok, const std::vector<int32_t>& ids,
                     const std::vector<ScoredToken>& scored) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  size_t offset = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    const std::string s = tok.token_bytes(ids[t]);
    tokens.push_back(s);
    offs.push_back(offset);
    offset += s.size();
    if (t == 0 || t - 1 >= scored.size()) {
      lps.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    const ScoredToken& x = scored[t - 1];
    lps.push_back(x.logprob);
    json top = json::object();
    for (const TokenLogprob& k : x.top) top[tok.token_bytes(k.token)] = k.logprob;
    top[s] = x.logprob;
    tops.push_back(top);
  }
  return {
      {"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json chat_completion(const ResponseHead& h, const Tokenizer& tok,
                     const std::vector<ChoiceOutput>& choices, bool logprobs, const json& usage) {
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutput& c = choices[i];
    list.push_back(
        {{"index", i},
         {"message", {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}}},
         {"logprobs", logprobs ? json{{"content", chat_logprob_entries(tok, c, 0, c.tokens.size())},
                                      {"refusal", nullptr}}
                               : json(nullptr)},
         {"finish_reason", openai_finish_reason(c.finish)}});
  }
  return {{"id", h.id},
          {"object", "chat.completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", list},
          {"usage", usage},
          {"system_fingerprint", nullptr}};
}

json text_completion(const ResponseHead& h, const Tokenizer& tok,
                     const std::vector<ChoiceOutput>& choices, bool logprobs,
                     const std::vector<std::string>& prefix, const json& usage,
                     const std::vector<json>& echoed) {
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutput& c = choices[i];
    const std::string& pre = i < prefix.size() ? prefix[i] : std::string();
    json lp = nullptr;
    if (logprobs) {
      lp = completion_logprobs(tok, c, 0, c.tokens.size(), pre.size());
      if (i < echoed.size()) {
        json whole = echoed[i];
        for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
          for (json& x : lp[k]) whole[k].push_back(std::move(x));
        lp = std::move(whole);
      }
    }
    list.push_back({{"index", i},
                    {"text", pre + c.text},
                    {"logprobs", lp},
                    {"finish_reason", openai_finish_reason(c.finish)}});
  }
  return {{"id", h.id},
          {"object", "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", list},
          {"usage", usage},
          {"system_fingerprint", nullptr}};
}

json chat_chunk(const ResponseHead& h, int64_t index, const json& delta, const json& logprobs,
                const char* finish, bool with_usage_field) {
  json c = {{"id", h.id},
            {"object", "chat.completion.chunk"},
            {"created", h.created},
            {"model", h.model},
            {"system_fingerprint", nullptr},
            {"choices", json::array({{{"index", index},
                                      {"delta", delta},
                                      {"logprobs", logprobs},
                                      {"finish_reason", null_or(finish)}}})}};
  if (with_usage_field) c["usage"] = nullptr;
  return c;
}

json completion_chunk(const ResponseHead& h, int64_t index, const std::string& text,
                      const json& logprobs, const char* finish, bool with_usage_field) {
  json c = {{"id", h.id},
            {"object", "text_completion"},
            {"created", h.created},
            {"model", h.model},
            {"system_fingerprint", nullptr},
            {"choices", json::array({{{"index", index},
                                      {"text", text},
                                      {"logprobs", logprobs},
                                      {"finish_reason", null_or(finish)}}})}};
  if (with_usage_field) c["usage"] = nullptr;
  return c;
}

json usage_chunk(const ResponseHead& h, bool chat, const json& usage) {
  return {{"id", h.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"system_fingerprint", nullptr},
          {"choices", json::array()},
          {"usage", usage}};
}

}  // namespace nk
