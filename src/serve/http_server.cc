#include "serve/http_server.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "core/error.h"

namespace nk {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// File descriptors kept aside from the connections: the listener, the
// model's files, the log, connections being refused over the cap.
constexpr int64_t kSpareFiles = 128;
// Connections over the cap that may be in their 503 at once; more are closed
// without one.
constexpr int64_t kMaxRefusing = 64;
// How long a closing connection reads and drops what its client still sends:
// closing a socket with unread bytes resets it, and the client may lose the
// response (a 413 to a body still coming) before it reads it.
constexpr auto kLinger = std::chrono::seconds(1);
// A response source is polled at least this often (ResponseSource).
constexpr auto kTick = std::chrono::seconds(1);
// After a failed accept (out of file descriptors) the next try waits.
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);
// A log line about connections refused over the cap, or about failed
// accepts, at most this often.
constexpr auto kBusyNoteEvery = std::chrono::seconds(10);
// How long stop() gives the connections to close before the loops end.
constexpr auto kCloseWait = std::chrono::milliseconds(500);

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The path of a request target, its %XX escapes decoded (a malformed one is
// kept as it is).
std::string target_path(std::string_view target) {
  target = target.substr(0, target.find('?'));
  std::string out;
  out.reserve(target.size());
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] == '%' && i + 2 < target.size()) {
      const int hi = hex_digit(target[i + 1]), lo = hex_digit(target[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += char(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += target[i];
  }
  return out;
}

// The status line and headers of `r`; `framing` is its Content-Length or
// Transfer-Encoding line, or "" for a body that ends with the connection.
std::string head_bytes(const HttpResponse& r, const std::string& framing, bool close,
                       bool say_keep_alive) {
  const auto why = http::obsolete_reason(http::int_to_status(unsigned(r.status)));
  std::string s =
      fmt::format("HTTP/1.1 {} {}\r\n", r.status, std::string_view(why.data(), why.size()));
  if (!r.content_type.empty()) s += fmt::format("Content-Type: {}\r\n", r.content_type);
  if (!framing.empty()) s += framing + "\r\n";
  for (const auto& [name, value] : r.headers) s += fmt::format("{}: {}\r\n", name, value);
  if (close)
    s += "Connection: close\r\n";
  else if (say_keep_alive)
    s += "Connection: keep-alive\r\n";
  s += "\r\n";
  return s;
}

// A route that throws still answers (HttpApp::handle must not, but a
// connection outlives any one request).
HttpReply safe_handle(HttpApp& app, HttpRequest& req) {
  try {
    return app.handle(req);
  } catch (const std::exception& e) {
    HttpReply r;
    r.response = app.refusal(req, 500, std::string("Internal error: ") + e.what());
    return r;
  }
}

std::string seconds_text(std::chrono::milliseconds d) {
  return fmt::format("{:g}", double(d.count()) / 1000.0);
}

}  // namespace

class HttpConnection;

struct HttpServer::Impl {
  Impl(HttpApp& a, const HttpLimits& l) : app(a), lim(l) {}

  HttpApp& app;
  const HttpLimits lim;
  // Before the loops: a connection that the loops' teardown destroys
  // forgets itself here.
  std::mutex mu;
  std::condition_variable cv;
  std::unordered_map<HttpConnection*, std::weak_ptr<HttpConnection>> connections;  // (mu)
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> open{0}, refusing{0};

  net::io_context network{};
  net::io_context workers{};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> network_guard,
      workers_guard;
  net::strand<net::io_context::executor_type> accept_strand{net::make_strand(network)};
  tcp::acceptor acceptor{accept_strand};
  net::steady_timer accept_retry{accept_strand};
  std::vector<std::thread> threads;
  bool torn_down = false;
  // Refusals over the cap since the last note, and the notes' times (accept
  // strand only).
  int64_t busy_refused = 0;
  Clock::time_point busy_noted{}, accept_noted{};

  void accept();
  void on_accept(beast::error_code ec, tcp::socket socket);
  void forget(HttpConnection* c, bool counted);
  void run_loop(net::io_context& ctx);
  void teardown();
};

// One client connection, served on its own strand: read a request whole,
// hand it to the app, write the answer, then read the next one.
class HttpConnection : public std::enable_shared_from_this<HttpConnection>, public ResponseWriter {
 public:
  HttpConnection(HttpServer::Impl& server, tcp::socket socket, bool counted)
      : s_(server),
        counted_(counted),
        socket_(std::move(socket)),
        deadline_(socket_.get_executor()),
        tick_(socket_.get_executor()) {}
  ~HttpConnection() override {
    // Torn down with answers unfinished (the server's loops ended): the
    // source must stop calling us.
    if (source_ && !source_done_) source_->abandon();
    s_.forget(this, counted_);
  }

  net::any_io_executor executor() { return socket_.get_executor(); }

  void start() {
    net::dispatch(executor(), [self = shared_from_this()] { self->read_request(); });
  }
  // Over the connection cap: 503 without reading the request, then close.
  void refuse_busy() {
    net::dispatch(executor(), [self = shared_from_this()] {
      self->req_ = std::make_shared<HttpRequest>();
      HttpResponse r = self->s_.app.refusal(
          *self->req_, 503,
          fmt::format("The server has serve.max_connections ({}) connections open; try again",
                      self->s_.lim.max_connections));
      r.close = true;
      self->send(std::move(r));
      self->flush();
    });
  }
  // The server is stopping: whatever is under way ends now.
  void close_now() {
    abandon_answer();
    close();
  }

  // ResponseWriter: what the answer adds to the bytes going out.
  void send(HttpResponse r) override {
    status_ = r.status;
    close_after_ = close_after_ || r.close || !keep_alive_;
    out_ += head_bytes(r, fmt::format("Content-Length: {}", r.body.size()), close_after_,
                       http10_ && !close_after_);
    out_ += r.body;
    complete_ = true;
  }
  void start_stream(HttpResponse head) override {
    status_ = head.status;
    // HTTP/1.0 has no chunks: the body ends with the connection.
    chunked_ = !http10_;
    close_after_ = close_after_ || head.close || !keep_alive_ || !chunked_;
    out_ += head_bytes(head, chunked_ ? "Transfer-Encoding: chunked" : "", close_after_,
                       http10_ && !close_after_);
  }
  void write(std::string bytes) override {
    if (bytes.empty()) return;  // an empty chunk would end the body
    if (chunked_) {
      out_ += fmt::format("{:x}\r\n", bytes.size());
      out_ += bytes;
      out_ += "\r\n";
    } else {
      out_ += bytes;
    }
  }
  void end() override {
    if (chunked_) out_ += "0\r\n\r\n";
    complete_ = true;
  }

 private:
  using Self = std::shared_ptr<HttpConnection>;

  void read_request() {
    if (closed_) return;
    if (s_.stopping.load()) return close();
    req_ = std::make_shared<HttpRequest>();
    parser_.emplace();
    parser_->header_limit(uint32_t(s_.lim.max_header));
    parser_->body_limit(uint64_t(s_.lim.max_body));
    // A pipelined request may be here already.
    if (buf_.size() > 0) return read_head();
    arm(s_.lim.idle_timeout);
    socket_.async_read_some(buf_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->disarm();
                              if (ec) return self->close();  // idle too long, or the client left
                              self->buf_.commit(n);
                              self->read_head();
                            });
  }

  void read_head() {
    arm(s_.lim.header_timeout);
    http::async_read_header(socket_, buf_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              self->disarm();
                              self->on_head(ec);
                            });
  }

  void on_head(beast::error_code ec) {
    req_->head_at = Clock::now();
    // Beast fills the method and target as soon as the request line is read,
    // so a refused head is logged with them when it got that far.
    const auto& h = parser_->get();
    req_->method = std::string(h.method_string());
    req_->target = std::string(h.target());
    req_->path = target_path(req_->target);
    if (ec) return read_failed(ec, true);
    keep_alive_ = h.keep_alive();
    http10_ = h.version() < 11;
    req_->content_type = std::string(h[http::field::content_type]);
    if (parser_->is_done()) return dispatch();
    if (beast::iequals(h[http::field::expect], "100-continue")) {
      // The client waits for this before it sends the body.
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      arm(s_.lim.write_timeout);
      net::async_write(socket_, net::buffer(kContinue),
                       [self = shared_from_this()](beast::error_code ec, size_t) {
                         self->disarm();
                         if (ec) return self->close();
                         self->read_body();
                       });
      return;
    }
    read_body();
  }

  void read_body() {
    arm(s_.lim.body_timeout);
    http::async_read(socket_, buf_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->disarm();
                       if (ec) return self->read_failed(ec, false);
                       self->dispatch();
                     });
  }

  void read_failed(beast::error_code ec, bool head) {
    if (closed_) return close();  // the server is stopping
    if (expired_)
      return refuse(408, head ? fmt::format("The request's head did not arrive within {} s "
                                            "(serve.header_timeout_s)",
                                            seconds_text(s_.lim.header_timeout))
                              : fmt::format("The request's body did not arrive within {} s "
                                            "(serve.body_timeout_s)",
                                            seconds_text(s_.lim.body_timeout)));
    if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
        ec == net::error::eof || ec == net::error::connection_reset ||
        ec == net::error::operation_aborted)
      return close();  // the client left
    if (ec == http::error::body_limit)
      return refuse(413, fmt::format("The request body is over the server's limit of {} MiB "
                                     "(serve.max_body_mb)",
                                     s_.lim.max_body >> 20));
    if (ec == http::error::header_limit)
      return refuse(431, fmt::format("The request's line and headers are over {} KiB",
                                     s_.lim.max_header >> 10));
    if (ec == http::error::bad_content_length)
      return refuse(400,
                    "The request's Content-Length is not a length (a decimal number of "
                    "bytes, the same in every Content-Length header)");
    refuse(400, fmt::format("Malformed HTTP request: {}", ec.message()));
  }

  // An answer from the connection layer itself; the connection closes after it.
  void refuse(int status, const std::string& why) {
    open_request_ = true;
    HttpResponse r = s_.app.refusal(*req_, status, why);
    r.close = true;
    send(std::move(r));
    flush();
  }

  void dispatch() {
    req_->read_at = Clock::now();
    req_->body = std::move(parser_->get().body());
    parser_.reset();
    open_request_ = true;
    if (s_.app.quick(*req_)) return answer(safe_handle(s_.app, *req_));
    handling_ = true;
    net::post(s_.workers, [self = shared_from_this(), req = req_] {
      HttpReply r = safe_handle(self->s_.app, *req);
      net::post(self->executor(),
                [self, r = std::move(r)]() mutable { self->answer(std::move(r)); });
    });
  }

  void answer(HttpReply r) {
    handling_ = false;
    if (closed_) {  // the server stopped meanwhile
      if (r.later) r.later->abandon();
      return finish_request(unanswered_status());
    }
    if (!r.later) {
      send(std::move(r.response));
      return flush();
    }
    source_ = std::move(r.later);
    source_done_ = false;
    // Wakes from the engine thread, coalesced: one post while one is pending.
    auto pending = std::make_shared<std::atomic<bool>>(false);
    std::weak_ptr<HttpConnection> weak = shared_from_this();
    net::any_io_executor ex = executor();
    source_->start([weak, ex, pending] {
      if (pending->exchange(true)) return;
      net::post(ex, [weak, pending] {
        pending->store(false);
        if (Self c = weak.lock()) c->pump();
      });
    });
    tick();
    pump();
  }

  // While a source answers, it is polled at least every kTick.
  void tick() {
    tick_.expires_after(kTick);
    tick_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closed_ || !self->source_ || self->source_done_) return;
      self->pump();
      self->tick();
    });
  }

  void pump() {
    if (closed_ || !source_ || source_done_ || writing_now_) return;
    bool done = false;
    try {
      done = source_->poll(*this);
    } catch (const std::exception& e) {
      fmt::print(stderr, "nekton serve: an answer failed: {}\n", e.what());
      abandon_answer();
      return close();
    }
    if (done) {
      source_done_ = true;
      tick_.cancel();
      if (!complete_ && status_ == 0)  // a source that ended without an answer
        send(s_.app.refusal(*req_, 500, "Internal error: the answer ended without a response"));
      else if (!complete_)
        end();
    }
    flush();
  }

  void flush() {
    if (closed_ || writing_now_) return;
    if (out_.empty()) {
      if (complete_ && (!source_ || source_done_)) after_response();
      return;
    }
    writing_.swap(out_);
    out_.clear();
    writing_now_ = true;
    arm(s_.lim.write_timeout);
    net::async_write(socket_, net::buffer(writing_),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->disarm();
                       self->writing_now_ = false;
                       self->writing_.clear();
                       if (ec) {  // the client left, or did not read within write_timeout
                         self->abandon_answer();
                         return self->close();
                       }
                       if (self->source_ && !self->source_done_) return self->pump();
                       self->flush();
                     });
  }

  // The answer is written: log it, then the next request (or close).
  void after_response() {
    finish_request(status_);
    source_.reset();  // the answer's hold (serve: in flight) ends with its last byte
    status_ = 0;
    complete_ = chunked_ = false;
    if (close_after_ || !keep_alive_ || s_.stopping.load()) return linger_close();
    read_request();
  }

  void finish_request(int status) {
    if (!open_request_) return;
    open_request_ = false;
    s_.app.finished(*req_, status);
  }

  // The connection ends before the answer did.
  void abandon_answer() {
    if (source_ && !source_done_) {
      source_done_ = true;
      source_->abandon();
    }
    source_.reset();
    // A request a worker holds is logged when the worker is done with it.
    if (!handling_) finish_request(status_ ? status_ : unanswered_status());
  }

  // The status logged for a request left without an answer: 503 when the
  // server stops, else 499 (the client left, as nginx logs it).
  int unanswered_status() const { return s_.stopping.load() ? 503 : 499; }

  void close() {
    closed_ = true;
    tick_.cancel();
    disarm();
    if (!socket_.is_open()) return;
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

  // The deadline of the read or write about to start: when it passes, the
  // operation is cancelled and ends with operation_aborted, expired_ set.
  void arm(std::chrono::milliseconds d) {
    expired_ = false;
    deadline_.expires_after(d);
    deadline_.async_wait([self = shared_from_this(), armed = ++armed_](beast::error_code ec) {
      if (ec || armed != self->armed_) return;  // disarmed or armed again since
      self->expired_ = true;
      beast::error_code ignored;
      self->socket_.cancel(ignored);
    });
  }
  void disarm() {
    ++armed_;
    deadline_.cancel();
  }

  // Shuts our side, then reads and drops what the client still sends for at
  // most kLinger, so that it reads the response before the socket closes.
  void linger_close() {
    if (closed_) return;
    if (s_.stopping.load()) return close();
    closed_ = true;
    tick_.cancel();
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close();
    buf_.clear();
    arm(std::chrono::duration_cast<std::chrono::milliseconds>(kLinger));
    drain();
  }

  void drain() {
    socket_.async_read_some(buf_.prepare(16384),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->close();  // EOF, or kLinger passed
                              self->drain();                 // (prepare() reuses the same bytes)
                            });
  }

  HttpServer::Impl& s_;
  const bool counted_;  // in open (else in refusing)
  tcp::socket socket_;
  // The deadline of the read or write under way (arm(), disarm()): a
  // generation number tells a stale expiry from the current one.
  net::steady_timer deadline_;
  uint64_t armed_ = 0;
  bool expired_ = false;
  net::steady_timer tick_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<HttpRequest> req_;  // the request being read or answered
  bool open_request_ = false;         // req_ is owed its finished()
  bool handling_ = false;             // a worker runs the route on req_
  bool keep_alive_ = true, http10_ = false;
  std::shared_ptr<ResponseSource> source_;
  bool source_done_ = false;
  // The answer: bytes not yet handed to the socket, and those going out.
  std::string out_, writing_;
  bool writing_now_ = false;
  int status_ = 0;
  bool complete_ = false, chunked_ = false, close_after_ = false;
  bool closed_ = false;
};

void HttpServer::Impl::accept() {
  acceptor.async_accept(
      net::make_strand(network),
      [this](beast::error_code ec, tcp::socket socket) { on_accept(ec, std::move(socket)); });
}

void HttpServer::Impl::on_accept(beast::error_code ec, tcp::socket socket) {
  if (stopping.load() || !acceptor.is_open()) return;
  if (ec) {
    // Out of file descriptors, most likely: try again a little later rather
    // than spin.
    const Clock::time_point now = Clock::now();
    if (now - accept_noted >= kBusyNoteEvery) {
      fmt::print(stderr, "nekton serve: accepting a connection failed ({}); retrying\n",
                 ec.message());
      accept_noted = now;
    }
    accept_retry.expires_after(kAcceptRetry);
    accept_retry.async_wait([this](beast::error_code ec) {
      if (!ec && !stopping.load()) accept();
    });
    return;
  }
  beast::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);  // tokens go out as they come
  const bool over = open.load() >= lim.max_connections;
  if (over && refusing.load() >= kMaxRefusing) {
    socket.close(ignored);
  } else {
    (over ? refusing : open).fetch_add(1);
    auto c = std::make_shared<HttpConnection>(*this, std::move(socket), !over);
    {
      std::lock_guard lock(mu);
      connections[c.get()] = c;
    }
    if (over)
      c->refuse_busy();
    else
      c->start();
  }
  if (over) {
    ++busy_refused;
    const Clock::time_point now = Clock::now();
    if (now - busy_noted >= kBusyNoteEvery) {
      fmt::print(stderr,
                 "nekton serve: serve.max_connections ({}) connections are open: {} new ones "
                 "answered 503\n",
                 lim.max_connections, busy_refused);
      busy_noted = now;
      busy_refused = 0;
    }
  }
  accept();
}

void HttpServer::Impl::forget(HttpConnection* c, bool counted) {
  std::lock_guard lock(mu);
  connections.erase(c);
  (counted ? open : refusing).fetch_sub(1);
  cv.notify_all();
}

void HttpServer::Impl::run_loop(net::io_context& ctx) {
  // A handler that throws ends run(); the loop goes on (a connection's
  // failure must not take the others down).
  for (;;) {
    try {
      ctx.run();
      return;
    } catch (const std::exception& e) {
      fmt::print(stderr, "nekton serve: internal error in the HTTP loop: {}\n", e.what());
    }
  }
}

void HttpServer::Impl::teardown() {
  if (torn_down) return;
  torn_down = true;
  {
    std::unique_lock lock(mu);
    cv.wait_for(lock, kCloseWait, [&] { return connections.empty(); });
  }
  network_guard.reset();
  workers_guard.reset();
  network.stop();
  workers.stop();
  for (std::thread& t : threads)
    if (t.joinable()) t.join();
  threads.clear();
}

HttpServer::HttpServer(HttpApp& app, const HttpLimits& limits)
    : impl_(std::make_unique<Impl>(app, limits)) {}

HttpServer::~HttpServer() {
  stop();
  impl_->teardown();
}

int HttpServer::bind(const std::string& host, int port) {
  Impl& s = *impl_;
  beast::error_code ec;
  tcp::resolver resolver(s.network);
  const auto found = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (!ec && found.empty()) ec = net::error::host_not_found;
  if (!ec) {
    const tcp::endpoint at = found.begin()->endpoint();
    s.acceptor.open(at.protocol(), ec);
    if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) s.acceptor.bind(at, ec);
    if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
  }
  if (ec) {
    beast::error_code ignored;
    s.acceptor.close(ignored);
    fail("serve.host, serve.port: cannot listen on {}:{}: {}", host, port, ec.message());
  }
  return s.acceptor.local_endpoint().port();
}

void HttpServer::start() {
  Impl& s = *impl_;
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
    ::getrlimit(RLIMIT_NOFILE, &files);
  }
  const int64_t need = s.lim.max_connections + kSpareFiles;
  if (files.rlim_cur != RLIM_INFINITY && int64_t(files.rlim_cur) < need)
    fail(
        "serve.max_connections={}: that many open connections need {} file descriptors with "
        "the server's own, but this process may open {} (ulimit -n); lower "
        "serve.max_connections or raise the limit",
        s.lim.max_connections, need, int64_t(files.rlim_cur));
  s.network_guard.emplace(s.network.get_executor());
  s.workers_guard.emplace(s.workers.get_executor());
  net::post(s.accept_strand, [&s] { s.accept(); });
  try {
    for (int i = 0; i < s.lim.network_threads; ++i)
      s.threads.emplace_back([&s] { s.run_loop(s.network); });
    for (int i = 0; i < s.lim.worker_threads; ++i)
      s.threads.emplace_back([&s] { s.run_loop(s.workers); });
  } catch (const std::system_error& e) {
    const size_t started = s.threads.size();
    stop();
    s.teardown();
    fail("serve: cannot start the HTTP server's threads ({} of {} started): {}", started,
         s.lim.network_threads + s.lim.worker_threads, e.what());
  }
}

void HttpServer::wait() {
  Impl& s = *impl_;
  {
    std::unique_lock lock(s.mu);
    s.cv.wait(lock, [&] { return s.stopping.load(); });
  }
  s.teardown();
}

void HttpServer::stop() {
  Impl& s = *impl_;
  std::vector<std::shared_ptr<HttpConnection>> open;
  {
    std::lock_guard lock(s.mu);
    if (s.stopping.exchange(true)) return;
    for (auto& [c, weak] : s.connections)
      if (auto sc = weak.lock()) open.push_back(std::move(sc));
    s.cv.notify_all();
  }
  net::post(s.accept_strand, [&s] {
    beast::error_code ignored;
    s.acceptor.close(ignored);
    s.accept_retry.cancel();
  });
  for (auto& c : open) net::post(c->executor(), [c] { c->close_now(); });
}

}  // namespace nk
