// What the HTTP connection layer (http_server.h) and the routes (server.h,
// completion_route.h) exchange: a request read whole, and an answer given at
// once or over time. No HTTP library type crosses this line.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace nk {

struct HttpRequest {
  std::string method;        // "GET", "POST", ...
  std::string target;        // as sent: path and query
  std::string path;          // the target without its query
  std::string content_type;  // "" when absent (the body is read the same whatever it says)
  std::string body;          // decoded (chunked or not), at most the server's body limit
  std::chrono::steady_clock::time_point head_at;  // when its head was read
  std::chrono::steady_clock::time_point read_at;  // when it was read whole
  // The routes' own record of the request (serve: its token counts), kept
  // until its log line; null for a request the connection layer refused.
  std::shared_ptr<void> note;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;  // besides Content-Type and framing
  std::string body;
  bool close = false;  // close the connection once it is written
};

// Where an answer that comes over time is written; the connection implements
// it. Either send() once, or start_stream(), write()s and end().
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // A whole response (with Content-Length).
  virtual void send(HttpResponse r) = 0;
  // A response whose body comes in pieces (chunked): `head`'s status and
  // headers now (its body is ignored), then each write() one chunk.
  virtual void start_stream(HttpResponse head) = 0;
  virtual void write(std::string bytes) = 0;
  virtual void end() = 0;
};

// An answer produced on another thread (the engine's). The connection calls
// poll() on its own thread: once started, after every wake, after each of its
// writes has gone out, and at least once a second (for keep-alive bytes);
// poll() never blocks, and is not called again while a write is still going
// out (so a client that does not read holds back the answer, not memory).
class ResponseSource {
 public:
  virtual ~ResponseSource() = default;
  // `wake` may be called from any thread, any number of times. Called once,
  // before the first poll.
  virtual void start(std::function<void()> wake) = 0;
  // Writes what is ready to `w`. Returns true once the answer is complete
  // (sent whole, or its stream ended).
  virtual bool poll(ResponseWriter& w) = 0;
  // The connection ended before the answer did (the client went away, a
  // write deadline passed, the server stopped). Called at most once, and
  // never after poll() returned true.
  virtual void abandon() = 0;
};

// What a route answers: a response now, or a source that answers later.
struct HttpReply {
  HttpResponse response;                  // when `later` is null
  std::shared_ptr<ResponseSource> later;  // set: the answer comes from here
};

}  // namespace nk
