// An error answered to an HTTP client in OpenAI's shape:
//   {"error": {"message": ..., "type": ..., "param": NAME|null, "code": STR|null}}
// with its HTTP status. Thrown by request parsing and the routes; the server
// turns it into the response and carries on.
#pragma once
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "serve/http_message.h"

namespace nk {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string code = "",
           std::string type = "");
  int status() const { return status_; }
  const std::string& param() const { return param_; }  // "" = null
  const std::string& code() const { return code_; }    // "" = null
  // "invalid_request_error" for 4xx, "server_error" for 5xx unless given.
  const std::string& type() const { return type_; }
  nlohmann::json to_json() const;
  // The HTTP response: to_json() with status().
  HttpResponse response() const;

 private:
  int status_;
  std::string param_, code_, type_;
};

// 400 invalid_request_error naming `param`.
template <typename... Args>
[[noreturn]] void bad_param(const std::string& param, fmt::format_string<Args...> f,
                            Args&&... args) {
  throw ApiError(400, fmt::format(f, std::forward<Args>(args)...), param);
}

}  // namespace nk
