// Server-sent events as OpenAI streams them: each event one `data: JSON`
// line and a blank line, the stream ended by `data: [DONE]`.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace nk {

// JSON text of `j` on one line; bytes of a string that are not valid UTF-8
// (generated text may hold any bytes) become U+FFFD rather than an exception.
std::string dump_json(const nlohmann::json& j);

// "data: " + dump_json(j) + "\n\n"
std::string sse_event(const nlohmann::json& j);
// "data: [DONE]\n\n"
std::string sse_done();
// A comment line (": \n\n"): clients skip it; the server writes one while a
// stream has nothing to say, to find out whether its client is still there.
std::string sse_keepalive();

}  // namespace nk
