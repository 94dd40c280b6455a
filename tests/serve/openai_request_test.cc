// Request bodies of the OpenAI routes: what parses into what, and every bad
// input's status, param and message.
#include "serve/openai_request.h"

#include <gtest/gtest.h>

#include "serve/api_error.h"

namespace nk {
namespace {

using json = nlohmann::json;

struct Refusal {
  int status = 0;
  std::string param, message;
};

template <class F>
Refusal refusal_of(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return {e.status(), e.param(), e.what()};
  }
  return {0, "", "(accepted)"};
}

Refusal chat_refusal(const std::string& body) {
  return refusal_of([&] { parse_completion_request(body, ApiKind::Chat); });
}
Refusal completion_refusal(const std::string& body) {
  return refusal_of([&] { parse_completion_request(body, ApiKind::Completion); });
}

// A chat request with `extra` fields added to one user message.
std::string chat_with(const json& extra) {
  json j = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  j.update(extra);
  return j.dump();
}

TEST(OpenAIRequest, ChatFieldsParse) {
  const CompletionRequest r = parse_completion_request(
      R"({"model": "m", "messages": [{"role": "developer", "content": "be brief"},
          {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
           "name": "ann"},
          {"role": "assistant", "content": "ok", "tool_calls": []}],
          "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": -1,
          "min_p": 0.1, "seed": -3, "stop": "x", "n": 2, "stream": true,
          "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 4,
          "presence_penalty": -1, "frequency_penalty": 2, "repetition_penalty": 1.2,
          "user": "u", "logit_bias": {}, "tools": null, "response_format": {"type": "text"},
          "ignore_eos": true})",
      ApiKind::Chat);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0].role, "system");  // developer is OpenAI's newer name
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.max_tokens_param, "max_completion_tokens");
  EXPECT_EQ(r.sampling.temperature, 0.5);
  EXPECT_EQ(r.sampling.top_p, 0.9);
  EXPECT_EQ(r.sampling.top_k, 0);  // vLLM's -1 = off
  EXPECT_EQ(r.sampling.min_p, 0.1);
  EXPECT_TRUE(r.seeded);
  EXPECT_EQ(r.sampling.seed, uint64_t(-3));
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream && r.include_usage && r.logprobs && r.ignore_eos);
  EXPECT_EQ(r.top_logprobs, 4);
  EXPECT_EQ(r.sampling.presence_penalty, -1);
  EXPECT_EQ(r.sampling.frequency_penalty, 2);
  EXPECT_EQ(r.sampling.repetition_penalty, 1.2);
}

TEST(OpenAIRequest, DefaultsAndNulls) {
  // OpenAI's clients send null for "not given".
  const CompletionRequest r = parse_completion_request(
      R"({"prompt": "p", "max_tokens": null, "temperature": null, "stop": null})",
      ApiKind::Completion);
  EXPECT_EQ(r.max_tokens, 0);
  EXPECT_EQ(r.sampling.temperature, 1.0);
  EXPECT_FALSE(r.seeded || r.stream || r.logprobs || r.echo);
  EXPECT_EQ(r.n, 1);
  EXPECT_TRUE(r.stop.empty());
}

TEST(OpenAIRequest, PromptForms) {
  auto prompts = [](const std::string& p) {
    return parse_completion_request(R"({"prompt": )" + p + "}", ApiKind::Completion).prompts;
  };
  auto one = prompts(R"("text")");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_FALSE(one[0].is_ids);
  EXPECT_EQ(one[0].text, "text");
  auto two = prompts(R"(["a", "b"])");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].text, "b");
  auto ids = prompts("[1, 2, 3]");
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_TRUE(ids[0].is_ids);
  EXPECT_EQ(ids[0].ids, (std::vector<int32_t>{1, 2, 3}));
  auto lists = prompts("[[1], [4, 5]]");
  ASSERT_EQ(lists.size(), 2u);
  EXPECT_EQ(lists[1].ids, (std::vector<int32_t>{4, 5}));
  const CompletionRequest r = parse_completion_request(
      R"({"prompt": "p", "logprobs": 3, "echo": false, "best_of": 1, "suffix": ""})",
      ApiKind::Completion);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
}

TEST(OpenAIRequest, MalformedBodies) {
  for (const char* body : {"", "{", "{\"messages\": [", "{\"a\": 1,}", "nul", "{\"a\": 1e400}"}) {
    const Refusal r = chat_refusal(body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_EQ(r.param, "") << body;
    EXPECT_NE(r.message.find("not valid JSON"), std::string::npos) << body << ": " << r.message;
    EXPECT_EQ(r.message.find("json.exception"), std::string::npos) << body << ": " << r.message;
  }
  EXPECT_NE(chat_refusal("{\"a\": 1e400}").message.find("(key 'a'): the number 1e400"),
            std::string::npos);
  const Refusal arr = chat_refusal("[1]");
  EXPECT_EQ(arr.status, 400);
  EXPECT_NE(arr.message.find("JSON object"), std::string::npos) << arr.message;
  // Invalid UTF-8 anywhere in a string, and escapes that are not characters.
  for (std::string body :
       {std::string("{\"prompt\": \"a\xff\"}"), std::string("{\"prompt\": \"\xc3\"}"),
        std::string("{\"prompt\": \"\xed\xa0\x80\"}"), std::string(R"({"prompt": "\udc00 x"})")}) {
    const Refusal r = completion_refusal(body);
    EXPECT_EQ(r.status, 400);
    EXPECT_NE(r.message.find("UTF-8"), std::string::npos) << r.message;
    // The message is valid UTF-8 itself (the bad bytes are not echoed).
    EXPECT_NO_THROW((void)json(r.message).dump()) << r.message;
  }
}

TEST(OpenAIRequest, WrongTypesNameTheField) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"temperature", "hot"}}, "temperature"},
      {{{"max_tokens", 1.5}}, "max_tokens"},
      {{{"max_tokens", "10"}}, "max_tokens"},
      {{{"n", true}}, "n"},
      {{{"stream", 1}}, "stream"},
      {{{"stop", 5}}, "stop"},
      {{{"stop", {"a", 2}}}, "stop[1]"},
      {{{"seed", 0.5}}, "seed"},
      {{{"logprobs", "yes"}}, "logprobs"},
      {{{"top_logprobs", 1.5}, {"logprobs", true}}, "top_logprobs"},
      {{{"stream_options", true}, {"stream", true}}, "stream_options"},
      {{{"stream_options", {{"include_usage", "y"}}}, {"stream", true}},
       "stream_options.include_usage"},
      {{{"model", 3}}, "model"},
      {{{"user", {1}}}, "user"},
      {{{"messages", "hi"}}, "messages"},
      {{{"messages", {3}}}, "messages[0]"},
      {{{"messages", {{{"role", 5}, {"content", "x"}}}}}, "messages[0].role"},
      {{{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}},
       "messages[0].content[0].type"},
      {{{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", 4}}}}}}}},
       "messages[0].content[0].text"},
  };
  for (const auto& [extra, param] : cases) {
    const Refusal r = chat_refusal(chat_with(extra));
    EXPECT_EQ(r.status, 400) << extra.dump();
    EXPECT_EQ(r.param, param) << extra.dump() << ": " << r.message;
  }
  const Refusal t = chat_refusal(chat_with({{"temperature", "hot"}}));
  EXPECT_EQ(t.message,
            "Invalid type for 'temperature': expected a decimal, but got a string instead.");
  EXPECT_EQ(completion_refusal(R"({"prompt": {}})").param, "prompt");
  EXPECT_EQ(completion_refusal(R"({"prompt": [[1], {}]})").param, "prompt[1]");
  EXPECT_EQ(completion_refusal(R"({"prompt": [1, -2]})").param, "prompt[1]");
  EXPECT_EQ(completion_refusal(R"({"prompt": "a", "logprobs": true})").param, "logprobs");
  EXPECT_EQ(completion_refusal(R"({"prompt": "a", "echo": "no"})").param, "echo");
}

TEST(OpenAIRequest, OutOfRangeNamesTheField) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"temperature", 2.01}}, "temperature"},
      {{{"temperature", -0.1}}, "temperature"},
      {{{"top_p", 0}}, "top_p"},
      {{{"top_p", 1.5}}, "top_p"},
      {{{"top_k", -2}}, "top_k"},
      {{{"min_p", 1.1}}, "min_p"},
      {{{"repetition_penalty", 0}}, "repetition_penalty"},
      {{{"presence_penalty", 2.5}}, "presence_penalty"},
      {{{"frequency_penalty", -3}}, "frequency_penalty"},
      {{{"n", 0}}, "n"},
      {{{"n", 129}}, "n"},
      {{{"max_tokens", 0}}, "max_tokens"},
      {{{"max_tokens", -5}}, "max_tokens"},
      {{{"max_completion_tokens", 1e12}}, "max_completion_tokens"},
      {{{"top_logprobs", 21}, {"logprobs", true}}, "top_logprobs"},
      {{{"stop", {"a", "b", "c", "d", "e"}}}, "stop"},
      {{{"stop", ""}}, "stop"},
  };
  for (const auto& [extra, param] : cases) {
    const Refusal r = chat_refusal(chat_with(extra));
    EXPECT_EQ(r.status, 400) << extra.dump();
    EXPECT_EQ(r.param, param) << extra.dump() << ": " << r.message;
    EXPECT_NE(r.message.find(param.substr(0, param.find('['))), std::string::npos) << r.message;
  }
  EXPECT_EQ(completion_refusal(R"({"prompt": "a", "logprobs": 21})").param, "logprobs");
}

TEST(OpenAIRequest, MissingEmptyUnknownAndUnsupported) {
  EXPECT_EQ(chat_refusal(R"({"messages": []})").param, "messages");
  EXPECT_EQ(chat_refusal(R"({"max_tokens": 4})").param, "messages");
  EXPECT_EQ(chat_refusal(R"({"messages": [{"content": "x"}]})").param, "messages[0].role");
  EXPECT_EQ(chat_refusal(R"({"messages": [{"role": "user"}]})").param, "messages[0].content");
  EXPECT_EQ(chat_refusal(R"({"messages": [{"role": "function", "content": "x"}]})").param,
            "messages[0].role");
  EXPECT_EQ(completion_refusal(R"({})").param, "prompt");
  EXPECT_EQ(completion_refusal(R"({"prompt": ""})").param, "prompt");
  EXPECT_EQ(completion_refusal(R"({"prompt": []})").param, "prompt");
  EXPECT_EQ(completion_refusal(R"({"prompt": [[]]})").param, "prompt[0]");
  // A chat field on the completions route, and a made-up one.
  for (const char* body : {R"({"prompt": "a", "messages": []})", R"({"prompt": "a", "foo": 1})"}) {
    const Refusal r = completion_refusal(body);
    EXPECT_EQ(r.status, 400);
    EXPECT_NE(r.message.find("Unrecognized request argument"), std::string::npos) << r.message;
  }
  EXPECT_EQ(completion_refusal(R"({"prompt": "a", "foo": 1})").param, "foo");
  // What would change the output but is not implemented is refused, not ignored.
  for (const auto& [extra, param] : std::vector<std::pair<json, std::string>>{
           {{{"tools", {{{"type", "function"}}}}}, "tools[0].function"},
           {{{"tool_choice", "required"}}, "tool_choice"},
           {{{"functions", {{{"name", "f"}}}}}, "functions"},
           {{{"response_format", {{"type", "json_object"}}}}, "response_format"},
           {{{"logit_bias", {{"50256", -100}}}}, "logit_bias"},
           {{{"store", true}}, "store"},
           {{{"stream_options", {{"include_usage", true}}}}, "stream_options"},
           {{{"top_logprobs", 2}}, "top_logprobs"},
       }) {
    const Refusal r = chat_refusal(chat_with(extra));
    EXPECT_EQ(r.status, 400) << extra.dump();
    EXPECT_EQ(r.param, param) << extra.dump() << ": " << r.message;
  }
  EXPECT_EQ(completion_refusal(R"({"prompt": "a", "suffix": "end"})").param, "suffix");
  EXPECT_EQ(completion_refusal(R"({"prompt": "a", "best_of": 3})").param, "best_of");
  // The prompt's log-probabilities (echo with logprobs) come whole: not
  // streamed; max_tokens 0 (the prompt alone) only with echo.
  EXPECT_EQ(
      completion_refusal(R"({"prompt": "a", "echo": true, "logprobs": 1, "stream": true})").param,
      "stream");
  EXPECT_EQ(completion_refusal(R"({"prompt": "a", "max_tokens": 0})").param, "max_tokens");
  EXPECT_EQ(
      completion_refusal(R"({"prompt": "a", "max_tokens": 0, "echo": true, "stream": true})").param,
      "stream");
  EXPECT_EQ(chat_refusal(chat_with({{"max_tokens", 0}})).param, "max_tokens");
  const CompletionRequest r = parse_completion_request(
      R"({"prompt": "a", "echo": true, "logprobs": 2, "max_tokens": 0})", ApiKind::Completion);
  EXPECT_TRUE(r.echo && r.logprobs && r.prompt_only);
  EXPECT_EQ(r.top_logprobs, 2);
}

// Tools go to the chat template as sent (keys in order: a template's tojson
// writes them so), and so do tool calls and tool results in the messages.
TEST(OpenAIRequest, ToolsToolCallsAndToolResults) {
  const CompletionRequest r = parse_completion_request(
      R"({"messages": [{"role": "user", "content": "weather?"},
          {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
          "tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"zz": {}, "city": {}}}}}],
          "tool_choice": "auto", "parallel_tool_calls": false})",
      ApiKind::Chat);
  EXPECT_EQ(r.tools.dump(),
            R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
            R"("properties":{"zz":{},"city":{}}}}}])");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1].content, "");
  EXPECT_EQ(r.messages[1].extra.dump(),
            R"({"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather",)"
            R"("arguments":"{\"city\": \"Oslo\"}"}}],"content":null})");
  EXPECT_EQ(r.messages[2].role, "tool");
  EXPECT_EQ(r.messages[2].extra.dump(), R"({"tool_call_id":"call_1"})");
  // No tools, or an empty list: none.
  EXPECT_TRUE(parse_completion_request(chat_with({{"tools", json::array()}}), ApiKind::Chat)
                  .tools.is_null());
  // What is malformed names the field.
  for (
      const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
          {R"({"messages": [{"role": "user", "content": null, "tool_calls": [{"function": {"name": "f"}}]}]})",
           "messages[0].tool_calls"},
          {R"({"messages": [{"role": "assistant", "content": null}]})", "messages[0].content"},
          {R"({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"function": {}}]}]})",
           "messages[0].tool_calls[0].function.name"},
          {R"({"messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]})",
           "messages[0].tool_call_id"},
          {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "x"}]})",
           "tools[0].type"},
          {R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})", "tools"},
      }) {
    const Refusal e = chat_refusal(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body << ": " << e.message;
  }
  const TokenizeRequest t = parse_tokenize_request(
      R"({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function",
          "function": {"name": "f"}}]})");
  EXPECT_EQ(t.tools.dump(), R"([{"type":"function","function":{"name":"f"}}])");
}

TEST(OpenAIRequest, TokenizeAndDetokenize) {
  const TokenizeRequest t = parse_tokenize_request(R"({"prompt": "hi", "model": "m"})");
  EXPECT_FALSE(t.chat);
  EXPECT_EQ(t.prompt, "hi");
  EXPECT_EQ(t.model, "m");
  const TokenizeRequest c = parse_tokenize_request(
      R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false})");
  EXPECT_TRUE(c.chat);
  EXPECT_FALSE(c.chat_end.add_generation_prompt);
  EXPECT_FALSE(c.chat_end.continue_final_message);
  // vLLM's continue_final_message: needs add_generation_prompt off, in
  // /tokenize and in chat completions alike.
  const std::string go_on =
      R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "A:"}],
          "add_generation_prompt": false, "continue_final_message": true})";
  EXPECT_TRUE(parse_tokenize_request(go_on).chat_end.continue_final_message);
  const CompletionRequest cc = parse_completion_request(go_on, ApiKind::Chat);
  EXPECT_TRUE(cc.chat_end.continue_final_message);
  EXPECT_FALSE(cc.chat_end.add_generation_prompt);
  const std::string both =
      R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true})";
  EXPECT_EQ(refusal_of([&] { parse_tokenize_request(both); }).param, "continue_final_message");
  const Refusal e = refusal_of([&] { parse_completion_request(both, ApiKind::Chat); });
  EXPECT_EQ(e.param, "continue_final_message");
  EXPECT_TRUE(e.message.find("Cannot set both") != std::string::npos) << e.message;
  // Completions have no conversation to continue.
  EXPECT_EQ(refusal_of([] {
              parse_completion_request(R"({"prompt": "x", "continue_final_message": false})",
                                       ApiKind::Completion);
            }).param,
            "continue_final_message");
  EXPECT_EQ(refusal_of([] { parse_tokenize_request("{}"); }).param, "prompt");
  EXPECT_EQ(refusal_of([] {
              parse_tokenize_request(
                  R"({"prompt": "a", "messages": [{"role": "user", "content": "x"}]})");
            }).status,
            400);
  EXPECT_EQ(refusal_of([] { parse_tokenize_request(R"({"prompt": 1})"); }).param, "prompt");
  EXPECT_EQ(parse_detokenize_request(R"({"tokens": [1, 2]})").tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(refusal_of([] { parse_detokenize_request(R"({"tokens": [1, "a"]})"); }).param,
            "tokens[1]");
  EXPECT_EQ(refusal_of([] { parse_detokenize_request(R"({})"); }).param, "tokens");
}

TEST(OpenAIRequest, ErrorShape) {
  const json j = ApiError(400, "bad", "temperature").to_json();
  EXPECT_EQ(j, json::parse(R"({"error": {"message": "bad", "type": "invalid_request_error",
                                         "param": "temperature", "code": null}})"));
  const json k = ApiError(404, "no", "model", "model_not_found").to_json();
  EXPECT_EQ(k["error"]["code"], "model_not_found");
  EXPECT_EQ(ApiError(500, "x").type(), "server_error");
  EXPECT_TRUE(ApiError(413, "x").to_json()["error"]["param"].is_null());
}

}  // namespace
}  // namespace nk
