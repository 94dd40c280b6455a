// `nekton serve` against hostile, slow and careless clients, over raw
// sockets on 127.0.0.1 (raw_http.h): bodies over the limit however they are
// framed, slow heads and bodies, idle connections, pipelined requests, the
// connection cap, malformed lengths, a client that stops reading a stream
// while the server is asked to stop, and a soak of mixed requests with the
// server's memory watched. Each test starts its own server over the tiny
// model of serve_test_util.h and kills it on every path.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <thread>

#include "raw_http.h"
#include "serve_test_util.h"

namespace nk {
namespace {

using json = nlohmann::json;
using test::contains;
using test::RawConnection;
using test::RawResponse;
using test::ServerProcess;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A field of /proc/PID/status in KiB (VmRSS: resident now; VmHWM: its
// peak), or -1.
int64_t proc_kib(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.starts_with(field + ":")) return std::stoll(line.substr(field.size() + 1));
  return -1;
}

// One chunk of a chunked body.
std::string chunk(const std::string& bytes) {
  return fmt::format("{:x}\r\n", bytes.size()) + bytes + "\r\n";
}

// The text of a streamed completion's events, and whether it ended with [DONE].
std::pair<std::string, bool> sse_text(const std::string& body) {
  std::string text;
  bool done = false;
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);) {
    if (line == "data: [DONE]") done = true;
    if (!line.starts_with("data: {")) continue;
    const json e = json::parse(line.substr(6), nullptr, false);
    if (e.is_object() && e.contains("choices"))
      for (const json& c : e["choices"]) text += c.value("text", "");
  }
  return {text, done};
}

class ServeHostile : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = d_ / "tiny";
    test::save_ascii_model(model_);
  }
  bool start(const std::vector<std::string>& extra = {}) {
    server_ = std::make_unique<ServerProcess>(model_, extra, d_ / "serve.log");
    EXPECT_GT(server_->port(), 0) << server_->log();
    return server_->port() > 0;
  }
  int port() const { return server_->port(); }
  // GET /health on a fresh connection: its seconds, or -1 without a 200
  // within `limit`.
  double health_seconds(double limit = 5) {
    const Clock::time_point t = Clock::now();
    RawConnection c(port());
    if (!c.connected() || !c.send(test::http_request("GET", "/health"), limit)) return -1;
    const auto r = c.read_response(limit);
    return r && r->status == 200 ? since(t) : -1;
  }

  test::TempDir d_{"nk_serve_hostile"};
  std::string model_;
  std::unique_ptr<ServerProcess> server_;
};

// A chunked body is held to serve.max_body_mb as it is decoded: 20 MB in
// 64 KiB chunks gets 413 once it passes 8 MiB, and the server's memory does
// not follow the upload.
TEST_F(ServeHostile, ChunkedBodyOverTheLimitIs413WithBoundedMemory) {
  ASSERT_TRUE(start());
  ASSERT_GT(health_seconds(), 0);
  const int64_t base = proc_kib(server_->pid(), "VmRSS");
  ASSERT_GT(base, 0);
  RawConnection c(port());
  ASSERT_TRUE(c.send(
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n" +
      chunk(R"({"max_tokens": 1, "prompt": ")")));
  const std::string piece = chunk(std::string(64 << 10, 'a'));
  int64_t sent = 0;
  bool refused = false;  // the server stopped reading
  while (sent < (int64_t(20) << 20) && !refused) {
    refused = !c.send(piece);
    if (!refused) sent += 64 << 10;
  }
  if (!refused) c.send(chunk(R"("})") + "0\r\n\r\n");
  const auto r = c.read_response();
  ASSERT_TRUE(r) << "no response after " << sent << " bytes\n" << server_->log();
  EXPECT_EQ(r->status, 413) << r->body;
  EXPECT_TRUE(contains(r->body, "serve.max_body_mb")) << r->body;
  EXPECT_FALSE(r->keep_alive);
  const int64_t peak = proc_kib(server_->pid(), "VmHWM");
  EXPECT_LT(peak - base, 200 * 1024) << "peak " << peak << " KiB, " << base << " KiB at start";
  EXPECT_GT(health_seconds(), 0) << server_->log();
}

// 200 clients that each send a header line every 2 s hold no thread: /health
// answers within 1 s all along, and each slow client gets a 408 and is
// closed once serve.header_timeout_s (10 s by default) has passed.
TEST_F(ServeHostile, SlowClientsDoNotStarveHealth) {
  ASSERT_TRUE(start());
  std::vector<std::unique_ptr<RawConnection>> slow;
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < 200; ++i) {
    slow.push_back(std::make_unique<RawConnection>(port()));
    ASSERT_TRUE(slow.back()->connected()) << i;
    ASSERT_TRUE(slow.back()->send("POST /v1/completions HTTP/1.1\r\n")) << i;
  }
  double worst = 0;
  for (int round = 0; round < 3 && worst < 1; ++round) {
    for (auto& c : slow) c->send(fmt::format("X-Slow-{}: yes\r\n", round), 1);
    for (int i = 0; i < 8 && worst < 1; ++i) {
      const double s = health_seconds(3);
      worst = s < 0 ? 3 : std::max(worst, s);
      ::usleep(250000);
    }
  }
  EXPECT_LT(worst, 1.0) << "/health took " << worst << " s beside 200 slow clients";
  int closed = 0, timed_out = 0;
  for (auto& c : slow) {
    closed += c->closed_within(std::max(0.5, 16 - since(t0)));
    const auto r = c->read_response(0.1);
    timed_out += r && r->status == 408 && contains(r->body, "serve.header_timeout_s");
  }
  EXPECT_EQ(closed, 200);
  EXPECT_EQ(timed_out, 200);
  EXPECT_GT(health_seconds(), 0);
}

// The deadlines: a connection that sends nothing closes after
// serve.idle_timeout_s, a head that does not finish gets 408 after
// serve.header_timeout_s, a body that does not finish after
// serve.body_timeout_s.
TEST_F(ServeHostile, IdleSlowHeadAndSlowBodyAreClosed) {
  ASSERT_TRUE(
      start({"serve.idle_timeout_s=1", "serve.header_timeout_s=1", "serve.body_timeout_s=1"}));
  RawConnection idle(port()), head(port()), body(port());
  ASSERT_TRUE(head.send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
  ASSERT_TRUE(body.send(
      "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"prompt\""));
  EXPECT_TRUE(idle.closed_within(5));
  EXPECT_FALSE(idle.read_response(0.1)) << "an idle connection closes without a response";
  EXPECT_TRUE(head.closed_within(5));
  auto r = head.read_response(0.1);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 408);
  EXPECT_TRUE(contains(r->body, "serve.header_timeout_s")) << r->body;
  EXPECT_TRUE(body.closed_within(5));
  r = body.read_response(0.1);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 408);
  EXPECT_TRUE(contains(r->body, "serve.body_timeout_s")) << r->body;
  EXPECT_TRUE(contains(server_->log(), "POST /tokenize 408")) << server_->log();
}

TEST_F(ServeHostile, HelpListsTheLimitKeys) {
  const auto r = test::run_nekton("serve --help");
  EXPECT_EQ(r.code, 0);
  for (const char* key : {"serve.header_timeout_s", "serve.body_timeout_s", "serve.idle_timeout_s",
                          "serve.write_timeout_s", "serve.max_connections", "at most 10 s"})
    EXPECT_TRUE(contains(r.out, key)) << key;
  const auto bad = test::run_nekton("serve serve.model=x serve.header_timeout_s=0");
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(contains(bad.out, "serve.header_timeout_s: must be in [1, 3600], got 0")) << bad.out;
}

// Requests sent back to back on one connection are all answered, in order,
// a completion before the /health behind it.
TEST_F(ServeHostile, PipelinedRequestsAreAnsweredInOrder) {
  ASSERT_TRUE(start());
  RawConnection c(port());
  ASSERT_TRUE(c.send(test::http_request("POST", "/v1/completions",
                                        R"({"prompt": "abc", "max_tokens": 3, "temperature": 0})") +
                     test::http_request("GET", "/health") +
                     test::http_request("POST", "/tokenize", R"({"prompt": "hello"})") +
                     test::http_request("GET", "/v1/models/other")));
  auto r = c.read_response();
  ASSERT_TRUE(r) << server_->log();
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 3);
  r = c.read_response();
  ASSERT_TRUE(r) << "the second request was dropped";
  EXPECT_EQ(json::parse(r->body), json({{"status", "ok"}}));
  r = c.read_response();
  ASSERT_TRUE(r) << "the third request was dropped";
  EXPECT_EQ(json::parse(r->body)["count"], 5);
  r = c.read_response();
  ASSERT_TRUE(r) << "the fourth request was dropped";
  EXPECT_EQ(r->status, 404);
  EXPECT_TRUE(r->keep_alive);
}

// serve.max_connections bounds the connections open at once: one more gets
// 503 and is closed; once one goes, a new one is served.
TEST_F(ServeHostile, ConnectionCapAnswers503) {
  ASSERT_TRUE(start({"serve.max_connections=4"}));
  std::vector<std::unique_ptr<RawConnection>> held;
  for (int i = 0; i < 3; ++i) held.push_back(std::make_unique<RawConnection>(port()));
  // The fourth is served: the three before it have been accepted too.
  held.push_back(std::make_unique<RawConnection>(port()));
  ASSERT_TRUE(held.back()->send(test::http_request("GET", "/health")));
  auto r = held.back()->read_response(5);
  ASSERT_TRUE(r) << server_->log();
  EXPECT_EQ(r->status, 200);
  RawConnection extra(port());
  r = extra.read_response(5);
  ASSERT_TRUE(r) << "no 503 over the cap";
  EXPECT_EQ(r->status, 503);
  EXPECT_TRUE(contains(r->body, "serve.max_connections")) << r->body;
  EXPECT_TRUE(extra.closed_within(5));
  held[0]->close();
  double health = -1;
  for (int i = 0; i < 50 && health < 0; ++i) {
    health = health_seconds(1);
    if (health < 0) ::usleep(100000);
  }
  EXPECT_GT(health, 0) << "a connection closed, and still no room";
}

// A server that cannot serve says why and exits 1 without the startup line:
// its port taken, or more connections allowed than it may open files.
TEST_F(ServeHostile, StartFailuresExitOne) {
  const int taken = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(taken, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(taken, 1), 0);
  ASSERT_EQ(::getsockname(taken, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  Clock::time_point t = Clock::now();
  auto r = test::run_command(fmt::format("timeout -k 5 20 {} serve serve.model={} serve.port={}",
                                         test::nekton_bin(), model_, port));
  ::close(taken);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "cannot listen on 127.0.0.1:" + std::to_string(port))) << r.out;
  EXPECT_FALSE(contains(r.out, "listening on")) << r.out;
  EXPECT_LT(since(t), 15);
  t = Clock::now();
  r = test::run_command(
      fmt::format("ulimit -n 256 && exec timeout -k 5 20 {} serve serve.model={} serve.port=0 "
                  "serve.max_connections=65536",
                  test::nekton_bin(), model_));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "serve.max_connections=65536") && contains(r.out, "ulimit -n"))
      << r.out;
  EXPECT_FALSE(contains(r.out, "listening on")) << r.out;
  EXPECT_LT(since(t), 15);
}

// SIGTERM ends the process within 10 s even while a client has stopped
// reading a long stream (its writes stall; the stream is cut off).
TEST_F(ServeHostile, SigtermWithAStalledStreamReaderEndsWithinTenSeconds) {
  ASSERT_TRUE(start());
  RawConnection c(port(), 4096);
  const json body = {{"messages", {{{"role", "user"}, {"content", "Hello there"}}}},
                     {"stream", true},
                     {"max_tokens", 1900},
                     {"n", 4},
                     {"logprobs", true},
                     {"top_logprobs", 5}};
  ASSERT_TRUE(c.send(test::http_request("POST", "/v1/chat/completions", body.dump())));
  const std::string first = c.read_some(10);
  ASSERT_TRUE(first.starts_with("HTTP/1.1 200")) << first << server_->log();
  ::sleep(3);  // the client reads no more; the server's socket buffer fills
  const Clock::time_point t = Clock::now();
  const int code = server_->stop(SIGTERM, 40);
  const double took = since(t);
  EXPECT_EQ(code, 0) << server_->log();
  EXPECT_LT(took, 10.0) << server_->log();
  EXPECT_TRUE(contains(server_->log(), "nekton serve: stopped")) << server_->log();
  std::printf("stalled stream: SIGTERM to exit %.2f s\n", took);
}

// A Content-Length that is not a length is a 400 (not a 413); a body is read
// as JSON whatever its Content-Type says (as OpenAI and vLLM do), so a form
// content type over 8 KiB is served.
TEST_F(ServeHostile, ContentLengthAndContentType) {
  ASSERT_TRUE(start());
  for (const std::string length : {"-5", "abc", "99999999999999999999999", "5, 6", ""}) {
    SCOPED_TRACE("Content-Length: " + length);
    RawConnection c(port());
    ASSERT_TRUE(c.send("POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + length +
                       "\r\n\r\n{}"));
    const auto r = c.read_response();
    ASSERT_TRUE(r) << server_->log();
    EXPECT_EQ(r->status, 400) << r->body;
    const json j = json::parse(r->body, nullptr, false);
    EXPECT_TRUE(j.is_object() && j.contains("error")) << r->body;
  }
  const std::string prompt(9 << 10, 'x');
  const std::string form = json{{"prompt", prompt}}.dump();
  for (const std::string type : {"application/x-www-form-urlencoded", "text/plain", ""}) {
    SCOPED_TRACE("Content-Type: " + type);
    RawConnection c(port());
    ASSERT_TRUE(c.send("POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                       (type.empty() ? "" : "Content-Type: " + type + "\r\n") +
                       "Content-Length: " + std::to_string(form.size()) + "\r\n\r\n" + form));
    const auto r = c.read_response();
    ASSERT_TRUE(r) << server_->log();
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body, nullptr, false).value("count", 0), 9 << 10);
  }
}

// 2,000 requests from 4 clients at once, good ones mixed with malformed,
// oversized, abandoned and slow ones: every good one is answered right, the
// server's resident memory at the end is within 10 % of its peak over the
// first half (a leak grows past it; the warm-up, which under a loaded
// machine is still touching memory after the first quarter, does not), and
// SIGTERM stops it within 10 s. (8,000 requests end where 2,000 do:
// 43.7 against 43.1 MiB, measured.)
// (NK_SOAK_REQUESTS=N runs a longer soak by hand.)
constexpr int kSoakRequests = 2000;
constexpr int kSoakClients = 4;

TEST_F(ServeHostile, SoakOfMixedRequests) {
  const char* env = std::getenv("NK_SOAK_REQUESTS");
  const int requests = env ? std::max(40, std::atoi(env)) : kSoakRequests;
  ASSERT_TRUE(start({"serve.max_body_mb=1", "serve.header_timeout_s=1", "serve.max_batch=8"}));
  const std::string greedy = R"({"prompt": "abc", "max_tokens": 3, "temperature": 0})";
  std::string expected;
  {
    RawConnection c(port());
    ASSERT_TRUE(c.send(test::http_request("POST", "/v1/completions", greedy)));
    const auto r = c.read_response();
    ASSERT_TRUE(r && r->status == 200);
    expected = json::parse(r->body)["choices"][0]["text"];
  }
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::unique_ptr<RawConnection>> slow;  // waiting for their 408 (mu)
  std::atomic<int> done{0};
  std::atomic<int64_t> peak_half{-1};
  const pid_t pid = server_->pid();
  auto failed = [&](int i, const std::string& what) {
    std::lock_guard lock(mu);
    failures.push_back(fmt::format("request {}: {}", i, what));
  };
  // One request of kind i % 10; `keep` is the client's kept-alive connection.
  auto one = [&](int i, std::unique_ptr<RawConnection>& keep) {
    if (!keep || !keep->connected()) keep = std::make_unique<RawConnection>(port());
    auto ask = [&](const std::string& bytes) -> std::optional<RawResponse> {
      if (!keep->send(bytes)) return std::nullopt;
      auto r = keep->read_response();
      if (!r || !r->keep_alive) keep.reset();
      return r;
    };
    // A fresh connection that sends `bytes`: the response, and whether the
    // server closed the connection after it.
    auto once = [&](const std::string& bytes) -> std::pair<std::optional<RawResponse>, bool> {
      RawConnection c(port());
      c.send(bytes);
      auto r = c.read_response();
      return {r, c.closed_within(5)};
    };
    switch (i % 10) {
      case 0: {
        const auto r = ask(test::http_request("GET", "/health"));
        if (!r || r->body != R"({"status":"ok"})") failed(i, "health: " + (r ? r->body : "none"));
        break;
      }
      case 1: {
        const auto r = ask(test::http_request("POST", "/v1/completions", greedy));
        const json j = r ? json::parse(r->body, nullptr, false) : json();
        if (!r || r->status != 200 || !j.is_object() ||
            j.value(json::json_pointer("/choices/0/text"), std::string()) != expected)
          failed(i, "completion: " + (r ? r->body : "none"));
        break;
      }
      case 2: {
        json body = json::parse(greedy);
        body["stream"] = true;
        const auto r = ask(test::http_request("POST", "/v1/completions", body.dump()));
        const auto [text, ended] = r ? sse_text(r->body) : std::pair{std::string(), false};
        if (!r || r->status != 200 || !ended || text != expected)
          failed(i, "stream: " + (r ? r->body : "none"));
        break;
      }
      case 3: {
        const auto r = ask(test::http_request("POST", "/tokenize", R"({"prompt": "soak"})"));
        if (!r || json::parse(r->body, nullptr, false).value("count", 0) != 4)
          failed(i, "tokenize: " + (r ? r->body : "none"));
        break;
      }
      case 4: {
        const auto r = ask(test::http_request("POST", "/v1/chat/completions", "{\"messages\": ["));
        if (!r || r->status != 400) failed(i, "malformed JSON: " + (r ? r->body : "none"));
        break;
      }
      case 5: {
        const auto [r, closed] =
            once("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n");
        if (!r || r->status != 400 || !closed) failed(i, "Content-Length -5");
        break;
      }
      case 6: {
        const auto [r, closed] = once(test::http_request(
            "POST", "/v1/completions", json{{"prompt", std::string(1100 << 10, 'a')}}.dump()));
        if (!r || r->status != 413 || !closed) failed(i, "body over the limit");
        break;
      }
      case 7: {
        std::string bytes =
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: "
            "chunked\r\n\r\n";
        for (int k = 0; k < 20; ++k) bytes += chunk(std::string(64 << 10, 'a'));
        const auto [r, closed] = once(bytes + "0\r\n\r\n");
        if (!r || r->status != 413 || !closed) failed(i, "chunked body over the limit");
        break;
      }
      case 8: {
        // Gone mid-head, or mid-stream.
        RawConnection c(port());
        if (i % 20 == 8) {
          c.send("POST /v1/completions HTTP/1.1\r\nContent-Le");
        } else {
          c.send(test::http_request("POST", "/v1/completions",
                                    R"({"prompt": "abc", "max_tokens": 200, "stream": true})"));
          c.read_some(5);
        }
        break;
      }
      case 9: {
        // Slow: half a head, then nothing; checked for its 408 at the end.
        auto c = std::make_unique<RawConnection>(port());
        c->send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n");
        std::lock_guard lock(mu);
        slow.push_back(std::move(c));
        break;
      }
    }
    if (done.fetch_add(1) + 1 == requests / 2) peak_half = proc_kib(pid, "VmHWM");
  };
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> clients;
  for (int k = 0; k < kSoakClients; ++k)
    clients.emplace_back([&, k] {
      std::unique_ptr<RawConnection> keep;
      for (int i = k; i < requests; i += kSoakClients) one(i, keep);
    });
  for (std::thread& t : clients) t.join();
  const double took = since(t0);
  const int64_t rss_end = proc_kib(pid, "VmRSS");
  for (const std::string& f : failures) ADD_FAILURE() << f;
  EXPECT_EQ(done.load(), requests);
  int timed_out = 0;
  for (auto& c : slow) {
    c->closed_within(5);
    const auto r = c->read_response(0.1);
    timed_out += r && r->status == 408;
  }
  EXPECT_EQ(timed_out, int(slow.size()));
  ASSERT_GT(peak_half.load(), 0);
  EXPECT_LE(double(rss_end), 1.10 * double(peak_half.load()))
      << "RSS peak " << peak_half.load() << " KiB over the first half, " << rss_end
      << " KiB at the end";
  EXPECT_GT(health_seconds(), 0);
  const Clock::time_point t = Clock::now();
  EXPECT_EQ(server_->stop(SIGTERM, 30), 0) << server_->log();
  const double stop = since(t);
  EXPECT_LT(stop, 10.0);
  std::printf(
      "soak: %d requests in %.1f s; RSS peak %lld KiB over the first half, %lld KiB at the end; "
      "SIGTERM to exit %.2f s\n",
      requests, took, static_cast<long long>(peak_half.load()), static_cast<long long>(rss_end),
      stop);
}

}  // namespace
}  // namespace nk
