// A small synchronous HTTP/1.1 client (Boost.Beast) for services Nekton
// calls: online RL's reward grader (align.reward_url) and the evaluation
// harness's server back end (eval.model=URL). http:// only; one request per
// connection; the whole exchange within a timeout.
#pragma once
#include <chrono>
#include <string>

namespace nk {

struct HttpUrl {
  std::string host, port = "80", target = "/";
};
// An http://HOST[:PORT][/PATH] URL; nk::Error naming `key` for another form.
HttpUrl parse_http_url(const std::string& key, const std::string& url);

struct HttpPostResult {
  int status = 0;
  std::string body;
};
// POSTs `body` (JSON) to `url` and reads the response, all within
// `timeout`. nk::Error (saying what failed: resolving, connecting, writing,
// reading, the timeout) otherwise.
HttpPostResult http_post_json(const HttpUrl& url, const std::string& body,
                              std::chrono::milliseconds timeout);

}  // namespace nk
