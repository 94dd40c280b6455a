// POST /v1/chat/completions and /v1/completions: a request is parsed,
// rendered (chat template) and tokenized, checked against the context,
// submitted to the engine as one sequence per prompt and choice (prompt i's
// choice j is choices[i * n + j], seed + j), and answered whole or streamed
// as server-sent events. Either way the answer is a ResponseSource that the
// connection polls as the engine's tokens come (no thread waits for them). A
// streaming client that goes away cancels its sequences at once.
#pragma once
#include <memory>
#include <string_view>
#include <vector>

#include "infer/generate.h"
#include "serve/http_message.h"
#include "serve/openai_request.h"
#include "serve/request_channel.h"
#include "serve/serve_context.h"

namespace nk {

// A request ready for the engine.
struct PreparedCompletion {
  CompletionRequest req;
  std::vector<GenerationRequest> sequences;
  std::vector<std::string> prefix;  // per choice: the echoed prompt text, else ""
  // With echo and logprobs, per choice: its prompt's ids, scored by
  // answer_completion into `echoed` (prompt_logprobs).
  std::vector<std::vector<int32_t>> echo_ids;
  std::vector<nlohmann::json> echoed;
  int64_t prompt_tokens = 0;  // usage: each prompt counted once
};

// ApiError (400 naming the field, 404 for another model) for a request that
// cannot be served.
PreparedCompletion prepare_completion(const ServeContext& ctx, std::string_view body, ApiKind kind);

// Submits the request; the reply answers it (JSON once every choice has
// ended, or an event stream as tokens come), or at once when an input
// guardrail refuses it or it asks for no completion (max_tokens 0). An
// echoed prompt's log-probabilities come from one full forward of it on the
// engine's thread (infer/perplexity.h's token_logprobs), the caller waiting. `tally` gets its token
// counts for the log line; `hold` is kept until the answer is written (a stream's last byte) or
// abandoned.
HttpReply answer_completion(const ServeContext& ctx, PreparedCompletion p,
                            ServeClock::time_point arrival, std::shared_ptr<RequestTally> tally,
                            std::shared_ptr<void> hold = nullptr);

// The prompt ids of a conversation: rendered by the template (with the
// request's tools, null for none) with the assistant's header appended
// (add_generation_prompt), or cut after the final message's content so the
// model goes on with it (continue_final_message, transformers' and vLLM's:
// an assistant turn the client opened), encoded with special-token strings
// as their ids (the fine-tuning data's path). ApiError 400 when there is no
// template, it refuses the conversation, or the final message cannot be
// continued.
std::vector<int32_t> chat_prompt_ids(const ServeContext& ctx,
                                     const std::vector<ChatMessage>& messages,
                                     const ChatPromptEnd& end = {},
                                     const nlohmann::ordered_json& tools = nullptr);

// ApiError 404 when `model` is given and is not the served model's id.
void check_model(const ServeContext& ctx, const std::string& model);

}  // namespace nk
