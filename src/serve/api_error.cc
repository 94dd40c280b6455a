#include "serve/api_error.h"

#include "serve/sse.h"

namespace nk {

ApiError::ApiError(int status, std::string message, std::string param, std::string code,
                   std::string type)
    : std::runtime_error(std::move(message)),
      status_(status),
      param_(std::move(param)),
      code_(std::move(code)),
      type_(std::move(type)) {
  if (type_.empty()) type_ = status_ >= 500 ? "server_error" : "invalid_request_error";
}

nlohmann::json ApiError::to_json() const {
  using json = nlohmann::json;
  return json{{"error",
               {{"message", what()},
                {"type", type_},
                {"param", param_.empty() ? json(nullptr) : json(param_)},
                {"code", code_.empty() ? json(nullptr) : json(code_)}}}};
}

HttpResponse ApiError::response() const {
  HttpResponse r;
  r.status = status_;
  r.body = dump_json(to_json());
  return r;
}

}  // namespace nk
