// A reward computed by an HTTP service (align.reward_url). Per score() call
// one request:
//   POST URL   Content-Type: application/json
//              {"inputs": [grader_input per rollout, in order]}
//   200        {"rewards": [x per input, in order]}  (a number or {"reward": x} each)
// over HTTP/1.1 (http:// only), the whole exchange within the timeout. A
// refused connection, a timeout, a status other than 200, or a body that is
// not that object with one number per input is an nk::Error naming the URL
// (and the status with the body's start).
#pragma once
#include <chrono>
#include <string>

#include "align/rewards/reward_function.h"

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

class HttpReward : public RewardFunction {
 public:
  HttpReward(std::string url, std::chrono::milliseconds timeout);
  std::vector<double> score(std::span<const RewardInput> in) override;

 private:
  std::string url_;
  HttpUrl parsed_;
  std::chrono::milliseconds timeout_;
};

}  // namespace nk
