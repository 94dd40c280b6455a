#include "serve/openai_request.h"

#include <cmath>
#include <set>

#include "core/json.h"
#include "infer/generate.h"
#include "serve/api_error.h"

namespace nk {
namespace {

using json = nlohmann::json;

// Most choices one request may ask for (OpenAI's limit for n).
constexpr int64_t kMaxChoices = 128;
// Most stop strings (OpenAI's limit).
constexpr size_t kMaxStops = 4;
// Most prompts one completions request may carry.
constexpr size_t kMaxPrompts = 1024;

// How OpenAI's messages name a JSON value's type.
const char* type_words(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a decimal";
    default:
      return "an integer";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const char* expected, const json& v) {
  bad_param(param, "Invalid type for '{}': expected {}, but got {} instead.", param, expected,
            type_words(v));
}

double number(const json& v, const std::string& param, double lo, double hi, bool lo_open = false) {
  if (!v.is_number()) wrong_type(param, "a decimal", v);
  const double x = v.get<double>();
  if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
    bad_param(param, "'{}' must be in {}{}, {}], got {}", param, lo_open ? "(" : "[", lo, hi, x);
  return x;
}

int64_t integer(const json& v, const std::string& param, int64_t lo, int64_t hi) {
  if (!v.is_number()) wrong_type(param, "an integer", v);
  try {
    return json_int(v, "request", param, lo, hi);
  } catch (const Error&) {
    bad_param(param, "'{}' must be an integer in [{}, {}], got {}", param, lo, hi, v.dump());
  }
}

bool boolean(const json& v, const std::string& param) {
  if (!v.is_boolean()) wrong_type(param, "a boolean", v);
  return v.get<bool>();
}

const std::string& string(const json& v, const std::string& param) {
  if (!v.is_string()) wrong_type(param, "a string", v);
  return v.get_ref<const std::string&>();
}

std::vector<std::string> stop_strings(const json& v) {
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.size() > kMaxStops)
      bad_param("stop", "'stop' may hold at most {} strings, got {}", kMaxStops, v.size());
    for (size_t i = 0; i < v.size(); ++i) out.push_back(string(v[i], fmt::format("stop[{}]", i)));
  } else {
    wrong_type("stop", "a string or an array of strings", v);
  }
  for (const std::string& s : out)
    if (s.empty()) bad_param("stop", "'stop' strings must not be empty");
  return out;
}

// A prompt given as token ids: a non-empty array of integers >= 0 (the
// vocabulary bound is the server's check).
std::vector<int32_t> token_ids(const json& v, const std::string& param) {
  if (v.empty()) bad_param(param, "'{}' is an empty list of tokens", param);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < v.size(); ++i)
    ids.push_back(int32_t(integer(v[i], fmt::format("{}[{}]", param, i), 0, INT32_MAX)));
  return ids;
}

// OpenAI's four forms: a string, a list of strings, a list of token ids, a
// list of lists of token ids.
std::vector<PromptInput> prompts(const json& v) {
  std::vector<PromptInput> out;
  if (v.is_string()) {
    out.push_back({v.get<std::string>(), {}, false});
  } else if (v.is_array() && !v.empty() && v[0].is_number()) {
    out.push_back({"", token_ids(v, "prompt"), true});
  } else if (v.is_array() && !v.empty()) {
    if (v.size() > kMaxPrompts)
      bad_param("prompt", "'prompt' holds {} prompts; at most {}", v.size(), kMaxPrompts);
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string p = fmt::format("prompt[{}]", i);
      if (v[i].is_string())
        out.push_back({v[i].get<std::string>(), {}, false});
      else if (v[i].is_array())
        out.push_back({"", token_ids(v[i], p), true});
      else
        wrong_type(p, "a string or an array of token ids", v[i]);
    }
  } else if (v.is_array()) {
    bad_param("prompt", "'prompt' is an empty list");
  } else {
    wrong_type("prompt", "a string or an array", v);
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (!out[i].is_ids && out[i].text.empty())
      bad_param("prompt", "prompt {} is empty: give at least one character", i);
  return out;
}

// The text of a message's content: a string, or text parts joined.
std::string content_text(const json& v, const std::string& param) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) wrong_type(param, "a string or an array of content parts", v);
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = fmt::format("{}[{}]", param, i);
    if (!v[i].is_object()) wrong_type(p, "an object", v[i]);
    const auto type = v[i].find("type");
    if (type == v[i].end() || !type->is_string())
      bad_param(p + ".type", "'{}.type' must be a string", p);
    if (*type != "text")
      bad_param(p + ".type", "content parts of type '{}' are not supported (text only)",
                type->get<std::string>());
    const auto t = v[i].find("text");
    if (t == v[i].end()) bad_param(p + ".text", "missing required parameter: '{}.text'", p);
    text += string(*t, p + ".text");
  }
  return text;
}

// A field that must be absent, null or "empty" (false, {}, [], "") because
// what it asks for is not implemented.
void refuse_unless_empty(const json& v, const std::string& param, const char* why) {
  // (nlohmann's empty() is false for every string, "" included.)
  const bool empty = v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
                     (v.is_string() && v.get_ref<const std::string&>().empty()) ||
                     ((v.is_object() || v.is_array()) && v.empty());
  if (!empty) bad_param(param, "'{}' is not supported by this server: {}", param, why);
}

}  // namespace

json parse_body(std::string_view body) {
  try {
    json j = json::parse(body);
    if (!j.is_object()) throw ApiError(400, "The request body must be a JSON object");
    return j;
  } catch (const json::parse_error& e) {
    const std::string what = e.what();
    if (what.find("UTF-8") != std::string::npos || what.find("surrogate") != std::string::npos)
      throw ApiError(400, fmt::format("The request body holds invalid UTF-8 (or a lone UTF-16 "
                                      "surrogate escape) in a string, near byte {}",
                                      e.byte));
    const std::optional<JsonFault> f = json_fault(body);
    throw ApiError(400, "The request body is not valid JSON: " +
                            (f ? f->describe() : std::string("syntax error")));
  } catch (const json::exception&) {
    // A number beyond a double's range (1e400), named with its key.
    const std::optional<JsonFault> f = json_fault(body);
    throw ApiError(400, "The request body is not valid JSON: " +
                            (f ? f->describe() : std::string("a number out of range")));
  }
}

namespace {

// OpenAI's tool calls of an assistant message: [{"id", "type": "function",
// "function": {"name", "arguments"}}, ...].
void check_tool_calls(const json& v, const std::string& p) {
  if (!v.is_array()) wrong_type(p, "an array", v);
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string q = fmt::format("{}[{}]", p, i);
    if (!v[i].is_object()) wrong_type(q, "an object", v[i]);
    const auto f = v[i].find("function");
    if (f == v[i].end() || !f->is_object())
      bad_param(q + ".function", "'{}.function' must be an object with a name", q);
    const auto name = f->find("name");
    if (name == f->end()) bad_param(q + ".function.name", "missing '{}.function.name'", q);
    string(*name, q + ".function.name");
  }
}

// The messages' keys other than role and content, in the order sent (from
// `ordered`, the same array parsed keeping key order).
nlohmann::ordered_json extra_keys(const nlohmann::ordered_json& m) {
  nlohmann::ordered_json extra;
  for (auto it = m.begin(); it != m.end(); ++it)
    if (it.key() == "tool_calls" || it.key() == "tool_call_id" || it.key() == "name") {
      if (extra.is_null()) extra = nlohmann::ordered_json::object();
      extra[it.key()] = it.value();
    }
  return extra;
}

}  // namespace

std::vector<ChatMessage> parse_messages(const json& v, const nlohmann::ordered_json& ordered) {
  if (!v.is_array()) wrong_type("messages", "an array", v);
  if (v.empty()) bad_param("messages", "'messages' must be a non-empty array");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = fmt::format("messages[{}]", i);
    const json& m = v[i];
    if (!m.is_object()) wrong_type(p, "an object", m);
    const auto role = m.find("role");
    if (role == m.end()) bad_param(p + ".role", "missing required parameter: '{}.role'", p);
    std::string r = string(*role, p + ".role");
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      bad_param(p + ".role",
                "'{}.role' is '{}'; supported roles: system, developer, user, assistant, tool", p,
                r);
    const auto calls = m.find("tool_calls");
    const bool has_calls = calls != m.end() && !calls->is_null() && !calls->empty();
    if (calls != m.end() && !calls->is_null()) {
      if (r != "assistant")
        bad_param(p + ".tool_calls", "'{}.tool_calls' is for assistant messages only", p);
      check_tool_calls(*calls, p + ".tool_calls");
    }
    if (const auto id = m.find("tool_call_id"); id != m.end() && !id->is_null())
      string(*id, p + ".tool_call_id");
    if (const auto name = m.find("name"); name != m.end()) string(*name, p + ".name");
    const auto content = m.find("content");
    const bool no_content = content == m.end() || content->is_null();
    if (no_content && !has_calls)
      bad_param(p + ".content", "missing required parameter: '{}.content'", p);
    ChatMessage msg(r, no_content ? "" : content_text(*content, p + ".content"));
    const nlohmann::ordered_json& om =
        ordered.is_array() && i < ordered.size() ? ordered[i] : nlohmann::ordered_json(m);
    msg.extra = extra_keys(om);
    if (no_content) msg.extra["content"] = nullptr;  // only tool calls
    out.push_back(std::move(msg));
  }
  return out;
}

namespace {

// OpenAI's tools: [{"type": "function", "function": {"name", "description",
// "parameters"}}, ...], which the chat template shows the model.
void check_tools(const json& v) {
  if (!v.is_array()) wrong_type("tools", "an array", v);
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = fmt::format("tools[{}]", i);
    if (!v[i].is_object()) wrong_type(p, "an object", v[i]);
    const auto type = v[i].find("type");
    if (type == v[i].end() || *type != "function")
      bad_param(p + ".type", "'{}.type' must be \"function\"", p);
    const auto f = v[i].find("function");
    if (f == v[i].end() || !f->is_object())
      bad_param(p + ".function", "'{}.function' must be an object with a name", p);
    const auto name = f->find("name");
    if (name == f->end()) bad_param(p + ".function.name", "missing '{}.function.name'", p);
    string(*name, p + ".function.name");
  }
}

}  // namespace

namespace {

void check_chat_end(const ChatPromptEnd& e) {
  if (e.add_generation_prompt && e.continue_final_message)
    bad_param("continue_final_message",
              "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true "
              "(send 'add_generation_prompt': false to continue the final message)");
}

}  // namespace

CompletionRequest parse_completion_request(std::string_view body, ApiKind kind) {
  const json j = parse_body(body);
  const bool chat = kind == ApiKind::Chat;
  // The messages and tools as sent, keys in order: a template's tojson
  // writes tool schemas and call arguments as given.
  nlohmann::ordered_json ordered;
  if (chat && (j.contains("tools") || j.contains("messages")))
    ordered = nlohmann::ordered_json::parse(body);
  CompletionRequest r;
  r.kind = kind;
  bool have_stream_options = false, have_top_logprobs = false;
  int64_t best_of = 0;
  for (const auto& [key, v] : j.items()) {
    if (v.is_null()) continue;  // OpenAI's clients send null for "not given"
    SamplingConfig& s = r.sampling;
    if (key == "model") {
      r.model = string(v, key);
    } else if (chat && key == "messages") {
      r.messages = parse_messages(v, ordered["messages"]);
    } else if (!chat && key == "prompt") {
      r.prompts = prompts(v);
    } else if (key == "max_tokens" || (chat && key == "max_completion_tokens")) {
      // 0 (completions with echo): the prompt alone, scored.
      r.max_tokens = integer(v, key, chat ? 1 : 0, INT32_MAX);
      r.max_tokens_param = key;
      r.prompt_only = r.max_tokens == 0;
    } else if (key == "temperature") {
      s.temperature = number(v, key, 0, 2);
    } else if (key == "top_p") {
      s.top_p = number(v, key, 0, 1, true);
    } else if (key == "top_k") {
      const int64_t k = integer(v, key, -1, INT32_MAX);
      s.top_k = k < 0 ? 0 : k;  // vLLM's -1 = off
    } else if (key == "min_p") {
      s.min_p = number(v, key, 0, 1);
    } else if (key == "repetition_penalty") {
      s.repetition_penalty = number(v, key, 0, 1e6, true);
    } else if (key == "presence_penalty") {
      s.presence_penalty = number(v, key, -2, 2);
    } else if (key == "frequency_penalty") {
      s.frequency_penalty = number(v, key, -2, 2);
    } else if (key == "seed") {
      s.seed = uint64_t(integer(v, key, INT64_MIN, INT64_MAX));
      r.seeded = true;
    } else if (key == "stop") {
      r.stop = stop_strings(v);
    } else if (key == "steerlm_attributes") {
      r.steerlm_attributes = string(v, key);
    } else if (key == "n") {
      r.n = integer(v, key, 1, kMaxChoices);
    } else if (key == "stream") {
      r.stream = boolean(v, key);
    } else if (key == "stream_options") {
      if (!v.is_object()) wrong_type(key, "an object", v);
      for (const auto& [k2, v2] : v.items()) {
        if (k2 != "include_usage")
          bad_param("stream_options." + k2,
                    "Unrecognized request argument supplied: stream_options.{}", k2);
        if (!v2.is_null()) r.include_usage = boolean(v2, "stream_options.include_usage");
      }
      have_stream_options = true;
    } else if (chat && key == "logprobs") {
      r.logprobs = boolean(v, key);
    } else if (chat && key == "top_logprobs") {
      r.top_logprobs = integer(v, key, 0, kMaxTopLogprobs);
      have_top_logprobs = true;
    } else if (!chat && key == "logprobs") {
      r.top_logprobs = integer(v, key, 0, kMaxTopLogprobs);
      r.logprobs = true;
    } else if (!chat && key == "echo") {
      r.echo = boolean(v, key);
    } else if (!chat && key == "best_of") {
      best_of = integer(v, key, 1, kMaxChoices);
    } else if (!chat && key == "suffix") {
      refuse_unless_empty(v, key, "no insertion (fill in the middle)");
    } else if (key == "ignore_eos") {
      r.ignore_eos = boolean(v, key);
    } else if (key == "user") {
      string(v, key);  // for abuse tracking at OpenAI; nothing here
    } else if (key == "logit_bias") {
      if (!v.is_object()) wrong_type(key, "an object", v);
      refuse_unless_empty(v, key, "no logit bias");
    } else if (chat && key == "tools") {
      check_tools(v);
      if (!v.empty()) r.tools = ordered["tools"];
    } else if (chat && key == "tool_choice") {
      if (v != "none" && v != "auto")
        bad_param(key,
                  "'tool_choice' {} is not supported by this server: the tools are shown to the "
                  "model through its chat template, but its answer is neither constrained nor "
                  "parsed into tool_calls; use \"auto\" or \"none\"",
                  v.dump());
    } else if (chat && (key == "functions" || key == "function_call")) {
      refuse_unless_empty(v, key, "deprecated by OpenAI for 'tools', which this server takes");
    } else if (chat && key == "add_generation_prompt") {
      r.chat_end.add_generation_prompt = boolean(v, key);
    } else if (chat && key == "continue_final_message") {
      r.chat_end.continue_final_message = boolean(v, key);
    } else if (chat && key == "parallel_tool_calls") {
      boolean(v, key);
    } else if (chat && key == "response_format") {
      if (!v.is_object()) wrong_type(key, "an object", v);
      if (v.value("type", json()) != "text")
        bad_param(key,
                  "'response_format' is not supported by this server: only {{\"type\": \"text\"}}");
    } else if (chat && key == "store") {
      if (boolean(v, key)) bad_param(key, "'store' is not supported by this server");
    } else if (chat && key == "metadata") {
      if (!v.is_object()) wrong_type(key, "an object", v);
    } else {
      bad_param(key, "Unrecognized request argument supplied: {}", key);
    }
  }
  if (chat && r.messages.empty()) bad_param("messages", "missing required parameter: 'messages'");
  if (chat) check_chat_end(r.chat_end);
  if (!chat && r.prompts.empty()) bad_param("prompt", "missing required parameter: 'prompt'");
  if (have_stream_options && !r.stream)
    bad_param("stream_options",
              "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
  if (chat && have_top_logprobs && r.top_logprobs > 0 && !r.logprobs)
    bad_param("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
  if (best_of && best_of != r.n)
    bad_param("best_of", "'best_of' must equal 'n' here (no ranking of extra samples)");
  if (r.prompt_only && !r.echo)
    bad_param("max_tokens", "'max_tokens' 0 asks for no completion: it needs 'echo' set to true");
  if (r.prompt_only && r.stream)
    bad_param("stream", "'stream' with 'max_tokens' 0: there is nothing to stream");
  if (r.echo && r.logprobs && r.stream)
    bad_param("stream",
              "'stream' with 'echo' and 'logprobs' is not supported (the prompt's "
              "log-probabilities come whole)");
  return r;
}

TokenizeRequest parse_tokenize_request(std::string_view body) {
  const json j = parse_body(body);
  nlohmann::ordered_json ordered;
  if (j.contains("tools") || j.contains("messages")) ordered = nlohmann::ordered_json::parse(body);
  TokenizeRequest r;
  bool have_prompt = false;
  for (const auto& [key, v] : j.items()) {
    if (v.is_null()) continue;
    if (key == "model") {
      r.model = string(v, key);
    } else if (key == "prompt") {
      r.prompt = string(v, key);
      have_prompt = true;
    } else if (key == "messages") {
      r.messages = parse_messages(v, ordered["messages"]);
      r.chat = true;
    } else if (key == "tools") {
      check_tools(v);
      if (!v.empty()) r.tools = ordered["tools"];
    } else if (key == "add_generation_prompt") {
      r.chat_end.add_generation_prompt = boolean(v, key);
    } else if (key == "continue_final_message") {
      r.chat_end.continue_final_message = boolean(v, key);
    } else if (key == "add_special_tokens") {
      boolean(v, key);  // the tokenizers here add none
    } else {
      bad_param(key, "Unrecognized request argument supplied: {}", key);
    }
  }
  if (have_prompt == r.chat) bad_param("prompt", "give exactly one of 'prompt' and 'messages'");
  if (r.chat) check_chat_end(r.chat_end);
  return r;
}

DetokenizeRequest parse_detokenize_request(std::string_view body) {
  const json j = parse_body(body);
  DetokenizeRequest r;
  bool have_tokens = false;
  for (const auto& [key, v] : j.items()) {
    if (v.is_null()) continue;
    if (key == "model") {
      r.model = string(v, key);
    } else if (key == "tokens") {
      if (!v.is_array()) wrong_type(key, "an array of token ids", v);
      for (size_t i = 0; i < v.size(); ++i)
        r.tokens.push_back(int32_t(integer(v[i], fmt::format("tokens[{}]", i), 0, INT32_MAX)));
      have_tokens = true;
    } else {
      bad_param(key, "Unrecognized request argument supplied: {}", key);
    }
  }
  if (!have_tokens) bad_param("tokens", "missing required parameter: 'tokens'");
  return r;
}

}  // namespace nk
