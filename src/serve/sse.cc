#include "serve/sse.h"

namespace nk {

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string sse_event(const nlohmann::json& j) {
  return "data: " + dump_json(j) + "\n\n";
}

std::string sse_done() {
  return "data: [DONE]\n\n";
}

std::string sse_keepalive() {
  return ": \n\n";
}

}  // namespace nk
