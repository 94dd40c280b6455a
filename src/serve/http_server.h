// The connection layer of `nekton serve`: HTTP/1.1 over Boost.Beast and
// Asio, event driven. A few network threads run every connection (accept,
// read, write, deadlines); a few worker threads run the routes that may block
// for a while (tokenizing, a guardrail); no thread belongs to a connection,
// so slow or idle clients cost a socket each, not a thread.
//
// Per connection: a request is read whole (head within header_timeout, body
// within body_timeout, at most max_header and max_body bytes however it is
// framed, chunked included), answered, and only then is the next one read:
// pipelined requests are answered in order. A request the layer refuses gets
// its status (400 malformed, 408 too slow, 413 body too large, 431 head too
// large) and the connection closes. At most max_connections are open; one
// more is answered 503 and closed. Every write must go out within
// write_timeout, so a client that stops reading loses its connection.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "serve/http_message.h"

namespace nk {

class HttpConnection;  // http_server.cc

struct HttpLimits {
  int64_t max_body = int64_t(8) << 20;     // bytes of a decoded request body
  int64_t max_header = int64_t(16) << 10;  // bytes of a request line and headers
  int64_t max_connections = 1024;          // open at once
  // A connection with no request for idle_timeout closes; a request's head
  // must arrive within header_timeout of its first byte, and its body within
  // body_timeout of its head; each write must go out within write_timeout.
  std::chrono::milliseconds idle_timeout{30'000}, header_timeout{10'000}, body_timeout{60'000},
      write_timeout{30'000};
  int network_threads = 2;  // run every connection's reads, writes and timers
  int worker_threads = 4;   // run the routes that are not quick()
};

// The routes behind the connection layer.
class HttpApp {
 public:
  virtual ~HttpApp() = default;
  // Whether `req` is answered on a network thread: routes that never block.
  virtual bool quick(const HttpRequest& req) const = 0;
  // The answer to a request read whole; on a worker thread unless quick().
  // Must not throw.
  virtual HttpReply handle(HttpRequest& req) = 0;
  // The response to a request the connection layer refuses (`status`, `why`
  // in words); `req` holds what was read of it (method and path may be "").
  virtual HttpResponse refusal(const HttpRequest& req, int status, const std::string& why) = 0;
  // Once per request read or refused, when its answer has been written or
  // abandoned; `status` is the one sent.
  virtual void finished(const HttpRequest& req, int status) = 0;
};

class HttpServer {
 public:
  HttpServer(HttpApp& app, const HttpLimits& limits);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Listens on host:port (0 picks a free port); returns the port. nk::Error
  // when the address cannot be bound.
  int bind(const std::string& host, int port);
  // Starts the threads and accepting. nk::Error when they cannot be started
  // or when max_connections cannot be open at once under the process's
  // file limit (raised to its hard limit first).
  void start();
  // Returns once stop() has closed every connection and the threads ended.
  void wait();
  // Stops accepting and closes every connection (answers being written are
  // abandoned). From any thread; idempotent.
  void stop();

 private:
  friend class HttpConnection;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nk
