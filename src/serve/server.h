// The routes of `nekton serve`: OpenAI's and vLLM's, behind the connection
// layer of http_server.h (which reads requests, enforces the limits and
// deadlines and writes answers).
//
//   POST /v1/chat/completions, /v1/completions   (completion_route.h)
//   GET  /v1/models, /v1/models/{id}, /health, /metrics
//   POST /tokenize, /detokenize                  (as vLLM names them)
//
// Every error is OpenAI's {"error": {...}} with its status (api_error.h):
// 400 for a bad request, 404 for an unknown route or model, 405 for a known
// route with another method, 408 for a request that came too slowly, 413 for
// a body over the limit, 431 for a head over it, 500 for an internal failure
// (the server carries on), 503 while stopping or over the connection cap.
// One line per request goes to stderr.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "serve/http_server.h"
#include "serve/serve_context.h"

namespace nk {

class OpenAIServer : private HttpApp {
 public:
  OpenAIServer(ServeContext& ctx, const HttpLimits& limits);
  // Binds host:port (0 picks a free port); returns the port. nk::Error when
  // the address cannot be bound.
  int bind(const std::string& host, int port) { return http_.bind(host, port); }
  // Starts serving. nk::Error when the server's threads cannot start or the
  // connection cap does not fit the process's file limit.
  void start() { http_.start(); }
  // Returns once stop() has closed every connection.
  void listen() { http_.wait(); }
  // For a graceful stop: from now on new requests get 503 while those in
  // flight go on. From any thread.
  void drain() { draining_.store(true); }
  // Completion requests being answered (a stream until its last byte).
  int64_t in_flight() const { return in_flight_->load(); }
  // Closes the listening socket and every connection; from any thread.
  void stop() { http_.stop(); }

 private:
  bool quick(const HttpRequest& req) const override;
  HttpReply handle(HttpRequest& req) override;
  HttpResponse refusal(const HttpRequest& req, int status, const std::string& why) override;
  void finished(const HttpRequest& req, int status) override;
  HttpReply route(HttpRequest& req, const std::shared_ptr<RequestTally>& tally);

  ServeContext& ctx_;
  std::atomic<bool> draining_{false};
  // Shared with answers that may outlive a handler call.
  std::shared_ptr<std::atomic<int64_t>> in_flight_ = std::make_shared<std::atomic<int64_t>>(0);
  HttpServer http_;  // last: its loops end before the rest goes
};

}  // namespace nk
