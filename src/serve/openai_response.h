// Response bodies of the OpenAI-compatible endpoints, in OpenAI's shapes:
//   chat.completion, chat.completion.chunk (streamed), text_completion
//   (both ways), usage, and the two logprobs shapes (chat's per-token
//   `content` list; completions' parallel tokens / token_logprobs /
//   top_logprobs / text_offset lists).
// Token strings are the tokens' bytes; where those are not valid UTF-8 (a
// piece of a character) the JSON text has U+FFFD and `bytes` (chat) the
// exact bytes.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer/tokenizer.h"
#include "infer/generate.h"
#include "infer/perplexity.h"

namespace nk {

// What every object of one response repeats.
struct ResponseHead {
  std::string id;       // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// "stop" (a stop string or end of sequence) or "length" (max_tokens or the
// context).
const char* openai_finish_reason(FinishReason r);

nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);

// One choice, put together from its sequence's events.
struct ChoiceOutput {
  std::string text;
  std::vector<int32_t> tokens;  // the eod id excluded
  std::vector<float> logprobs;  // per token, with the request's logprobs
  std::vector<std::vector<TokenLogprob>> top;
  int64_t sampled = 0;  // tokens sampled, the eod id included (usage counts these)
  bool finished = false;
  FinishReason finish = FinishReason::Length;
};

// Chat's logprobs.content entries for tokens [from, to) of `c`.
nlohmann::json chat_logprob_entries(const Tokenizer& tok, const ChoiceOutput& c, size_t from,
                                    size_t to);
// Completions' logprobs object for tokens [from, to) of `c`; text_offset
// counts bytes of the choice's text from `offset` (the bytes before token
// `from`).
nlohmann::json completion_logprobs(const Tokenizer& tok, const ChoiceOutput& c, size_t from,
                                   size_t to, size_t offset);

// Completions' logprobs object of an echoed prompt: its tokens, each's
// log-probability given those before it (the first null: nothing predicts
// it), its top_logprobs (the `top` most likely and the token itself; the
// first null) and text_offset from 0. scored[t - 1] scores ids[t].
nlohmann::json prompt_logprobs(const Tokenizer& tok, const std::vector<int32_t>& ids,
                               const std::vector<ScoredToken>& scored);

// Whole responses. logprobs: whether the request asked for them.
nlohmann::json chat_completion(const ResponseHead& h, const Tokenizer& tok,
                               const std::vector<ChoiceOutput>& choices, bool logprobs,
                               const nlohmann::json& usage);
// prefix[i]: text that starts choice i (the prompt, with echo), else "".
// echoed[i] (when given): choice i's prompt_logprobs, which its completion's
// logprobs continue (text_offset past the prefix).
nlohmann::json text_completion(const ResponseHead& h, const Tokenizer& tok,
                               const std::vector<ChoiceOutput>& choices, bool logprobs,
                               const std::vector<std::string>& prefix, const nlohmann::json& usage,
                               const std::vector<nlohmann::json>& echoed = {});

// Streamed chunks. delta: {"role": ..., "content": ...}, either optional;
// logprobs and finish null when absent; usage (with include_usage) null on
// every chunk but the last.
nlohmann::json chat_chunk(const ResponseHead& h, int64_t index, const nlohmann::json& delta,
                          const nlohmann::json& logprobs, const char* finish,
                          bool with_usage_field);
nlohmann::json completion_chunk(const ResponseHead& h, int64_t index, const std::string& text,
                                const nlohmann::json& logprobs, const char* finish,
                                bool with_usage_field);
// The last chunk with include_usage: no choices, the usage.
nlohmann::json usage_chunk(const ResponseHead& h, bool chat, const nlohmann::json& usage);

}  // namespace nk
