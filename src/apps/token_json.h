// A token as the commands print it in JSON (eval logprobs, generate's
// logprobs).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer/tokenizer.h"
#include "infer/sampler.h"

namespace nk {

// Sets j["token"] to the token's text, its bytes as UTF-8 where they are (a
// piece may end inside a character: invalid bytes become U+FFFD), and
// j["bytes"] to the bytes themselves, as OpenAI's logprobs give them. An id
// of a padded vocabulary that the tokenizer lacks gets null for both.
void put_token_json(nlohmann::ordered_json& j, const Tokenizer& tok, int32_t id);

// One scored token as JSON, after the given fields: {..., "id", "token",
// "bytes", "logprob", "top_logprobs": [{"id", "token", "bytes", "logprob"}]}.
nlohmann::ordered_json logprob_json(nlohmann::ordered_json j, const Tokenizer& tok, int32_t id,
                                    double logprob, const std::vector<TokenLogprob>& top);
// The same as one line of a table: `index id "text" logprob` and the top ones.
std::string logprob_line(int64_t index, const nlohmann::ordered_json& j);

}  // namespace nk
