// The HTTP side of `nekton serve`: OpenAI's and vLLM's routes over
// cpp-httplib, each request answered on a thread of a pool of
// serve.max_connections (a streaming response holds its thread until the
// stream ends).
//
//   POST /v1/chat/completions, /v1/completions   (completion_route.h)
//   GET  /v1/models, /v1/models/{id}, /health, /metrics
//   POST /tokenize, /detokenize                  (as vLLM names them)
//
// Every error is OpenAI's {"error": {...}} with its status (api_error.h):
// 400 for a bad request, 404 for an unknown route or model, 405 for a known
// route with another method, 413 for a body over the limit, 500 for an
// internal failure (the server carries on). One line per request goes to
// stderr.
#pragma once
#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "serve/serve_context.h"

namespace nk {

class OpenAIServer {
 public:
  // max_body: bytes; threads: worker threads.
  OpenAIServer(ServeContext& ctx, int64_t max_body, int64_t threads);
  // Binds host:port (0 picks a free port); returns the port. nk::Error when
  // the address cannot be bound.
  int bind(const std::string& host, int port);
  // Serves until stop(); returns when the requests being answered have ended.
  void listen();
  // For a graceful stop: from now on new requests get 503 while those in
  // flight go on. From any thread.
  void drain() { draining_.store(true); }
  // Completion requests being answered (a stream until its last byte).
  int64_t in_flight() const { return in_flight_->load(); }
  // Closes the listening socket and every connection; from any thread.
  void stop();

 private:
  void routes();
  ServeContext& ctx_;
  httplib::Server svr_;
  std::atomic<bool> draining_{false};
  // Shared with streams that may outlive a handler call.
  std::shared_ptr<std::atomic<int64_t>> in_flight_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace nk
