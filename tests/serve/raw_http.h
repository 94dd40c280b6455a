// A raw HTTP/1.1 client over a POSIX socket, for the tests of hostile and
// slow clients: it sends exactly the bytes it is given (chunked uploads,
// pipelined requests, malformed heads, a header line at a time) and reads
// responses with Beast's parser. Every wait is bounded.
#pragma once
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace nk::test {

struct RawResponse {
  int status = 0;
  std::string body;
  std::string content_type;
  bool keep_alive = true;
};

class RawConnection {
 public:
  // Connects to 127.0.0.1:port; `receive_buffer` > 0 shrinks the socket's
  // receive buffer first (a client that stops reading then stalls the
  // server's writes soon).
  explicit RawConnection(int port, int receive_buffer = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) return;
    if (receive_buffer > 0)
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      fd_ = -1;
      return;
    }
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  }
  ~RawConnection() { close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return fd_ >= 0; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Sends all of `bytes` within `seconds`; false when the server closed the
  // connection or the time ran out.
  bool send(std::string_view bytes, double seconds = 10) {
    const auto end = deadline(seconds);
    while (!bytes.empty()) {
      if (fd_ < 0 || !wait_for(POLLOUT, end)) return false;
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) return false;
      bytes.remove_prefix(size_t(n));
    }
    return true;
  }

  // The next whole response within `seconds`, else nothing (closed, timed
  // out, not HTTP).
  std::optional<RawResponse> read_response(double seconds = 10) {
    namespace http = boost::beast::http;
    const auto end = deadline(seconds);
    http::response_parser<http::string_body> p;
    p.body_limit(std::numeric_limits<std::uint64_t>::max());
    p.eager(true);
    for (;;) {
      if (!pending_.empty()) {
        boost::beast::error_code ec;
        const size_t used = p.put(boost::asio::buffer(pending_), ec);
        pending_.erase(0, used);
        if (p.is_done()) break;
        if (ec && ec != http::error::need_more) return std::nullopt;
        if (!ec && used > 0) continue;
      }
      const int got = receive(end);
      if (got == 0) {  // closed: a body that ends with the connection is whole now
        if (!p.got_some()) return std::nullopt;
        boost::beast::error_code ec;
        p.put_eof(ec);
        if (!ec && p.is_done()) break;
        return std::nullopt;
      }
      if (got < 0) return std::nullopt;
    }
    RawResponse r;
    r.status = int(p.get().result_int());
    r.body = p.get().body();
    r.content_type = std::string(p.get()[http::field::content_type]);
    r.keep_alive = p.get().keep_alive();
    return r;
  }

  // Up to what has come within `seconds` (at least one byte unless closed or
  // timed out), raw.
  std::string read_some(double seconds) {
    std::string out;
    if (pending_.empty()) receive(deadline(seconds));
    out.swap(pending_);
    return out;
  }

  // True when the server closes the connection within `seconds`; what it
  // sends meanwhile is kept for read_response().
  bool closed_within(double seconds) {
    const auto end = deadline(seconds);
    for (;;) {
      const int got = receive(end);
      if (got == 0) return true;
      if (got < 0) return errno_ == ECONNRESET || errno_ == EPIPE;
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  static Clock::time_point deadline(double seconds) {
    return Clock::now() + std::chrono::microseconds(int64_t(seconds * 1e6));
  }
  bool wait_for(short events, Clock::time_point end) {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd_, events, 0};
      const int n = ::poll(&p, 1, int(left));
      if (n > 0) return true;
      if (n < 0 && errno != EINTR) return false;
    }
  }
  // Appends what comes to pending_: > 0 bytes read, 0 closed, -1 timed out
  // or failed (errno_ says which).
  int receive(Clock::time_point end) {
    errno_ = ETIMEDOUT;
    while (fd_ >= 0 && wait_for(POLLIN, end)) {
      char buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n > 0) {
        pending_.append(buf, size_t(n));
        return int(n);
      }
      if (n == 0) return 0;
      if (errno == EAGAIN || errno == EINTR) continue;
      errno_ = errno;
      return -1;
    }
    return -1;
  }

  int fd_ = -1;
  int errno_ = 0;
  std::string pending_;  // bytes read past the last response
};

// A request's bytes: `method` `path` with `body` (Content-Length) and `extra`
// header lines ("Name: value\r\n" each).
inline std::string http_request(const std::string& method, const std::string& path,
                                const std::string& body = "", const std::string& extra = "") {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra;
  if (!body.empty() || method == "POST")
    r +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  return r + "\r\n" + body;
}

}  // namespace nk::test
