#include "align/rewards/http_reward.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <optional>

#include "core/error.h"

namespace nk {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

HttpUrl parse_http_url(const std::string& key, const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind("https://", 0) == 0)
    fail("{}: '{}': https is not supported; serve the grader over http:// (e.g. on localhost)", key,
         url);
  if (url.rfind(scheme, 0) != 0) fail("{}: '{}' is not an http://HOST[:PORT][/PATH] URL", key, url);
  HttpUrl u;
  const std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  if (slash != std::string::npos) u.target = rest.substr(slash);
  if (!authority.empty() && authority[0] == '[') {  // [v6]:port
    const size_t close = authority.find(']');
    if (close == std::string::npos) fail("{}: '{}': an unclosed '[' in the host", key, url);
    u.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') fail("{}: '{}': junk after the host", key, url);
      u.port = authority.substr(close + 2);
    }
  } else {
    const size_t colon = authority.rfind(':');
    u.host = authority.substr(0, colon);
    if (colon != std::string::npos) u.port = authority.substr(colon + 1);
  }
  if (u.host.empty()) fail("{}: '{}' names no host", key, url);
  if (u.port.empty() || u.port.size() > 5 ||
      u.port.find_first_not_of("0123456789") != std::string::npos || std::stoi(u.port) > 65535)
    fail("{}: '{}': the port '{}' is not a number up to 65535", key, url, u.port);
  return u;
}

HttpPostResult http_post_json(const HttpUrl& url, const std::string& body,
                              std::chrono::milliseconds timeout) {
  asio::io_context io;
  tcp::resolver resolver(io);
  beast::tcp_stream stream(io);
  beast::flat_buffer buf;
  http::request<http::string_body> req{http::verb::post, url.target, 11};
  req.set(http::field::host, url.host + ":" + url.port);
  req.set(http::field::user_agent, "nekton-reward");
  req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  http::response_parser<http::string_body> res;
  res.body_limit(size_t(256) << 20);
  std::string failed;  // the step that failed and why
  bool done = false;
  auto step = [&](const char* what, beast::error_code ec) {
    if (!ec) return true;
    failed = ec == beast::error::timeout
                 ? fmt::format("{}: no answer within {} ms", what, timeout.count())
                 : fmt::format("{}: {}", what, ec.message());
    return false;
  };
  // Every step runs within what is left of the deadline.
  stream.expires_after(timeout);
  resolver.async_resolve(
      url.host, url.port, [&](beast::error_code ec, tcp::resolver::results_type found) {
        if (!step("resolving the host", ec)) return;
        stream.async_connect(found, [&](beast::error_code ec, const tcp::endpoint&) {
          if (!step("connecting", ec)) return;
          http::async_write(stream, req, [&](beast::error_code ec, size_t) {
            if (!step("sending the request", ec)) return;
            http::async_read(stream, buf, res, [&](beast::error_code ec, size_t) {
              if (step("reading the response", ec)) done = true;
            });
          });
        });
      });
  io.run_for(timeout + std::chrono::milliseconds(100));
  if (!done && failed.empty()) failed = fmt::format("no answer within {} ms", timeout.count());
  if (!done) fail("{}", failed);
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  return {int(res.get().result_int()), res.get().body()};
}

HttpReward::HttpReward(std::string url, std::chrono::milliseconds timeout)
    : url_(std::move(url)), parsed_(parse_http_url("align.reward_url", url_)), timeout_(timeout) {}

std::vector<double> HttpReward::score(std::span<const RewardInput> in) {
  if (in.empty()) return {};  // no request for nothing
  const std::string name = fmt::format("align.reward_url '{}'", url_);
  nlohmann::json inputs = nlohmann::json::array();
  for (const RewardInput& x : in) inputs.push_back(grader_input(x));
  HttpPostResult r;
  try {
    r = http_post_json(parsed_,
                       nlohmann::json{{"inputs", std::move(inputs)}}.dump(
                           -1, ' ', false, nlohmann::json::error_handler_t::replace),
                       timeout_);
  } catch (const Error& e) {
    fail("{}: {} (align.reward_timeout_s {} s)", name, e.what(), double(timeout_.count()) / 1000);
  }
  const std::string head = r.body.size() > 300 ? r.body.substr(0, 300) + "..." : r.body;
  if (r.status != 200) fail("{}: HTTP status {} (body: '{}')", name, r.status, head);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(r.body);
  } catch (const nlohmann::json::exception&) {
    fail("{}: the body is not JSON: '{}'", name, head);
  }
  if (!j.is_object() || !j.contains("rewards") || !j["rewards"].is_array())
    fail("{}: the body is not {{\"rewards\": [...]}}: '{}'", name, head);
  const nlohmann::json& rw = j["rewards"];
  if (rw.size() != in.size()) fail("{}: {} rewards for {} inputs", name, rw.size(), in.size());
  std::vector<double> v(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    try {
      v[i] = grader_reward(rw[i]);
    } catch (const Error& e) {
      fail("{}: rewards[{}] (for {}): {}", name, i, rollout_name(in, i), e.what());
    }
  }
  return v;
}

}  // namespace nk
