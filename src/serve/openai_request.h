// Request bodies of the OpenAI-compatible endpoints, parsed and checked.
//
// Every field is checked for type and range; an error is an ApiError 400
// naming the field (OpenAI's "param"). What cannot be checked without the
// model (prompt lengths against the context, token ids against the
// vocabulary, the model name) is checked by the server.
//
// Fields OpenAI defines that would change the output but are not
// implemented (response_format other than text, logit_bias, suffix, best_of
// > n, tool_choice other than auto/none) are refused rather than ignored; an
// unknown field is refused as OpenAI does ("Unrecognized request argument
// supplied"). Tools are shown to the model through the chat template (the
// answer is text: it is not parsed into tool_calls).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "data/chat/chat_template.h"
#include "infer/sampler.h"

namespace nk {

enum class ApiKind { Chat, Completion };

// One prompt of /v1/completions: text, or token ids.
struct PromptInput {
  std::string text;
  std::vector<int32_t> ids;
  bool is_ids = false;
};

// How a chat prompt ends (vLLM's extra parameters of chat completions and
// /tokenize): with the assistant's header for a new answer, or, with
// continue_final_message, inside the final message (both at once refused).
struct ChatPromptEnd {
  bool add_generation_prompt = true;
  bool continue_final_message = false;
};

struct CompletionRequest {
  ApiKind kind = ApiKind::Completion;
  std::string model;                            // "" = not given
  std::vector<ChatMessage> messages;            // chat
  nlohmann::ordered_json tools;                 // chat: the tools as sent; null: none
  ChatPromptEnd chat_end;                       // chat
  std::vector<PromptInput> prompts;             // completions: at least one
  int64_t max_tokens = 0;                       // 0 = not given (or prompt_only)
  bool prompt_only = false;                     // completions: max_tokens 0 with echo
  std::string max_tokens_param = "max_tokens";  // the field that gave it
  SamplingConfig sampling;
  bool seeded = false;  // sampling.seed was given
  std::vector<std::string> stop;
  int64_t n = 1;  // choices per prompt
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;
  int64_t top_logprobs = 0;
  // completions: the prompt text starts each choice; with logprobs, its
  // tokens come first in the logprobs, scored by the model (the first null).
  bool echo = false;
  bool ignore_eos = false;  // vLLM's extension
  // SteerLM's attribute values "name:value,..." (our extension; "" = none):
  // the prompt is conditioned on them as align.method=steerlm's data was.
  std::string steerlm_attributes;
};

// The body as a JSON object; ApiError 400 for malformed JSON, invalid UTF-8
// or a body that is not an object.
nlohmann::json parse_body(std::string_view body);

// ApiError 400 naming the field for anything wrong (see above).
CompletionRequest parse_completion_request(std::string_view body, ApiKind kind);

// OpenAI's messages: a non-empty array of {"role", "content"} with content a
// string or a list of text parts; "developer" is taken as "system"; "tool"
// results (with tool_call_id) and assistant tool_calls (content may then be
// null) go to the template, with name, in the key order of `ordered` (the
// same array parsed keeping it; null: as parsed).
std::vector<ChatMessage> parse_messages(const nlohmann::json& messages,
                                        const nlohmann::ordered_json& ordered = nullptr);

// POST /tokenize: {"prompt": TEXT} or {"messages": [...]} (and optionally
// "model", "add_generation_prompt", "continue_final_message",
// "add_special_tokens").
struct TokenizeRequest {
  std::string model;
  bool chat = false;
  std::string prompt;
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools;  // null: none
  ChatPromptEnd chat_end;
};
TokenizeRequest parse_tokenize_request(std::string_view body);

// POST /detokenize: {"tokens": [ID, ...]} (and optionally "model").
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
DetokenizeRequest parse_detokenize_request(std::string_view body);

}  // namespace nk
