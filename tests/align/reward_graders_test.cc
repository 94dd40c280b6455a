// Online RL's external graders (src/align/rewards): a command reading JSONL
// on stdin (a Python grader written here; ones that exit 3, die by a signal,
// hang past a short timeout, print a wrong count or a non-number) and an
// HTTP endpoint (served here by a small Beast server thread; a refused
// connection, a bad status, a bad body, a hang).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

#include "align/rewards/reward_set.h"
#include "test_util.h"

namespace nk {
namespace {

using json = nlohmann::json;
using test::contains;
using Clock = std::chrono::steady_clock;

struct Batch {
  std::vector<json> records;
  std::vector<json> prompts;
  std::vector<RewardInput> in;
  Batch(std::vector<json> recs, const std::vector<std::string>& completions)
      : records(std::move(recs)) {
    prompts.resize(completions.size());
    for (size_t i = 0; i < completions.size(); ++i) {
      prompts[i] = i % 2 ? json::array({{{"role", "user"}, {"content", "q" + std::to_string(i)}}})
                         : json("q" + std::to_string(i));
      in.push_back({&records[i], &prompts[i], completions[i], int64_t(completions[i].size()),
                    i == 1, "p.jsonl:" + std::to_string(i + 1)});
    }
  }
};

Batch three() {
  return Batch({{{"answer", "72"}, {"id", 0}}, {{"answer", "5"}, {"id", 1}}, {{"answer", "9"}}},
               {"#### 72", "it is 6", "#### 9 $(touch PWNED) `touch PWNED`; rm -rf x"});
}

RewardSet command_set(const std::string& command, double timeout_s = 30) {
  RewardsConfig c;
  c.funcs = "command";
  c.command = command;
  c.timeout_s = timeout_s;
  return RewardSet(c, RewardModelSource{});
}

std::string error_of(RewardSet& set, std::span<const RewardInput> in) {
  try {
    set.score(in);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// No child process is left, not even a zombie.
bool no_children() {
  errno = 0;
  return ::waitpid(-1, nullptr, WNOHANG) == -1 && errno == ECHILD;
}

TEST(CommandReward, APythonGraderScoresEveryRolloutInOrder) {
  test::TempDir dir("nk_reward_cmd");
  // 1 when the completion's "####" answer is the record's, plus what it was
  // given as the id, the truncated flag and the prompt's form.
  test::write_file(dir / "grade.py", R"(import json, sys
for line in sys.stdin:
    x = json.loads(line)
    ok = x["completion"].split("####")[-1].split()[0] == x["answer"] if "####" in x["completion"] else False
    r = float(ok) + 10 * x.get("id", 0) + 100 * x["truncated"] + (0.5 if isinstance(x["prompt"], list) else 0.25)
    print(json.dumps({"reward": r}) if x.get("id") == 1 else r)
)");
  RewardSet set = command_set("cd " + dir.path().string() + " && /usr/bin/python3 grade.py");
  Batch b = three();
  const RewardScores s = set.score(b.in);
  ASSERT_EQ(s.parts.size(), 1u);
  EXPECT_EQ(s.parts[0].name, "command");
  EXPECT_FALSE(s.parts[0].verifiable);
  EXPECT_EQ(s.total, (std::vector<double>{1.25, 10 + 100 + 0.5, 1.25}));
  // The data went through stdin only: nothing in it ran.
  EXPECT_FALSE(std::filesystem::exists(dir / "PWNED"));
  EXPECT_TRUE(no_children());
}

TEST(CommandReward, AGraderThatDoesNotReadItsInputStillAnswers) {
  // 2 MB of input to a grader that never reads it: the write ends (EPIPE,
  // no SIGPIPE), its answer counts. SIGPIPE's default action (nekton align
  // does not ignore it; another test may have) would end this process.
  struct DefaultSigpipe {
    struct sigaction old {};
    DefaultSigpipe() {
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigaction(SIGPIPE, &dfl, &old);
    }
    ~DefaultSigpipe() { sigaction(SIGPIPE, &old, nullptr); }
  } dfl;
  RewardSet set = command_set("exec 0<&-; printf '0.5\\n0.25\\n'; sleep 0.2");
  Batch b({json::object(), json::object()}, {std::string(1 << 20, 'a'), std::string(1 << 20, 'b')});
  EXPECT_EQ(set.score(b.in).total, (std::vector<double>{0.5, 0.25}));
  EXPECT_TRUE(no_children());
}

TEST(CommandReward, ACrashNamesTheCommandTheStatusAndStderr) {
  Batch b = three();
  RewardSet exits = command_set("cat >/dev/null; echo 'grader: no key \"gold\"' >&2; exit 3");
  std::string e = error_of(exits, b.in);
  EXPECT_TRUE(contains(e, "reward 'command': align.reward_command 'cat >/dev/null;")) << e;
  EXPECT_TRUE(contains(e, "exited with status 3 (stderr: grader: no key \"gold\")")) << e;
  RewardSet killed = command_set("kill -SEGV $$");
  e = error_of(killed, b.in);
  EXPECT_TRUE(contains(e, "killed by signal 11 (Segmentation fault)")) << e;
  EXPECT_TRUE(killed.score({}).total.empty());  // an empty batch runs nothing
  RewardSet missing = command_set("/no/such/grader --x");
  e = error_of(missing, b.in);
  EXPECT_TRUE(contains(e, "exited with status 127")) << e;
  EXPECT_TRUE(contains(e, "/no/such/grader")) << e;
  EXPECT_TRUE(no_children());
}

TEST(CommandReward, AHangIsKilledAtTheTimeout) {
  test::TempDir dir("nk_reward_hang");
  // The shell runs python as its child (not exec'd: a command follows), so
  // only killing the process group ends it.
  const std::string pid_file = dir / "pid";
  RewardSet set = command_set("/usr/bin/python3 -c 'import os, time; open(\"" + pid_file +
                                  "\", \"w\").write(str(os.getpid())); time.sleep(60)'; echo 1",
                              0.5);
  Batch b = three();
  const Clock::time_point t0 = Clock::now();
  const std::string e = error_of(set, b.in);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));  // generous bound on a busy machine
  EXPECT_TRUE(contains(e,
                       "no answer within 500 ms (align.reward_timeout_s); its process group "
                       "was killed"))
      << e;
  EXPECT_TRUE(no_children());
  // The grandchild is gone too (or a zombie its new parent has yet to reap).
  const std::string pid = test::read_file(pid_file);
  ASSERT_FALSE(pid.empty());
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    const std::string stat = test::read_file("/proc/" + pid + "/stat");
    gone = stat.empty() || contains(stat, ") Z ");
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(gone) << "python " << pid << " still runs";
}

TEST(CommandReward, AWrongCountOrANonNumberNamesTheLine) {
  Batch b = three();
  RewardSet short_set = command_set("cat >/dev/null; echo 1");
  std::string e = error_of(short_set, b.in);
  EXPECT_TRUE(contains(e, "wrote 1 lines for 3 rollouts")) << e;
  RewardSet word = command_set("cat >/dev/null; printf '1\\nabc\\n3\\n'");
  e = error_of(word, b.in);
  EXPECT_TRUE(contains(e, "output line 2 ('abc', for rollout 1 (p.jsonl:2)): not JSON")) << e;
  RewardSet obj = command_set("cat >/dev/null; printf '1\\n{\"score\": 2}\\nNaN\\n'");
  e = error_of(obj, b.in);
  EXPECT_TRUE(contains(e, "output line 2")) << e;
  EXPECT_TRUE(contains(e, "without \"reward\"")) << e;
  EXPECT_TRUE(no_children());
}

// A one-connection-at-a-time HTTP server on 127.0.0.1 answering each
// request with `answer(body)` -> (status, body).
class GraderServer {
 public:
  using Answer = std::function<std::pair<int, std::string>(const std::string& body)>;
  explicit GraderServer(Answer answer)
      : answer_(std::move(answer)),
        acceptor_(io_, {boost::asio::ip::make_address("127.0.0.1"), 0}) {
    port_ = acceptor_.local_endpoint().port();
    thread_ = std::thread([this] { serve(); });
  }
  ~GraderServer() {
    stop_ = true;
    boost::system::error_code ec;
    boost::asio::ip::tcp::socket s(io_);
    s.connect({boost::asio::ip::make_address("127.0.0.1"), port_}, ec);  // wakes accept()
    thread_.join();
  }
  std::string url(const std::string& path = "/score") const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  std::string last_body, last_content_type, last_target;

 private:
  void serve() {
    namespace http = boost::beast::http;
    while (!stop_) {
      boost::asio::ip::tcp::socket s(io_);
      boost::system::error_code ec;
      acceptor_.accept(s, ec);
      if (ec || stop_) return;
      boost::beast::flat_buffer buf;
      http::request<http::string_body> req;
      http::read(s, buf, req, ec);
      if (ec) continue;
      last_body = req.body();
      last_content_type = std::string(req[http::field::content_type]);
      last_target = std::string(req.target());
      auto [status, body] = answer_(req.body());
      http::response<http::string_body> res{http::status(status), 11};
      res.set(http::field::content_type, "application/json");
      res.body() = body;
      res.prepare_payload();
      http::write(s, res, ec);
    }
  }
  Answer answer_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

RewardSet http_set(const std::string& url, double timeout_s = 30) {
  RewardsConfig c;
  c.funcs = "accuracy,http";
  c.weights = "1,0.5";
  c.accuracy.extract = "gsm8k";
  c.url = url;
  c.timeout_s = timeout_s;
  return RewardSet(c, RewardModelSource{});
}

TEST(HttpReward, AnEndpointScoresEveryRolloutInOrder) {
  // Rewards the length of each completion; the second as {"reward": x}.
  GraderServer server([](const std::string& body) {
    const json in = json::parse(body)["inputs"];
    json r = json::array();
    for (size_t i = 0; i < in.size(); ++i) {
      const double len = double(in[i]["completion"].get<std::string>().size());
      r.push_back(i == 1 ? json{{"reward", len}} : json(len));
    }
    return std::pair{200, json{{"rewards", r}}.dump()};
  });
  RewardSet set = http_set(server.url());
  Batch b = three();
  const RewardScores s = set.score(b.in);
  ASSERT_EQ(s.parts.size(), 2u);
  EXPECT_EQ(s.parts[1].name, "http");
  EXPECT_EQ(s.parts[0].values, (std::vector<double>{1, 0, 1}));
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(s.parts[1].values[i], double(b.in[i].completion.size()));
    EXPECT_EQ(s.total[i], s.parts[0].values[i] + 0.5 * s.parts[1].values[i]);
  }
  // What the endpoint got: the record's fields beside prompt and completion.
  EXPECT_EQ(server.last_target, "/score");
  EXPECT_EQ(server.last_content_type, "application/json");
  const json sent = json::parse(server.last_body)["inputs"];
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[1]["answer"], "5");
  EXPECT_EQ(sent[1]["id"], 1);
  EXPECT_EQ(sent[1]["prompt"], b.prompts[1]);
  EXPECT_EQ(sent[1]["completion"], "it is 6");
  EXPECT_EQ(sent[1]["truncated"], true);
  EXPECT_EQ(sent[1]["completion_tokens"], 7);
}

TEST(HttpReward, BadAnswersAreErrorsNamingTheUrl) {
  std::pair<int, std::string> next{200, ""};
  GraderServer server([&](const std::string&) { return next; });
  RewardSet set = http_set(server.url());
  Batch b = three();
  const std::string name = "reward 'http': align.reward_url '" + server.url() + "': ";
  next = {500, "{\"error\": \"grader crashed\"}"};
  std::string e = error_of(set, b.in);
  EXPECT_TRUE(contains(e, name + "HTTP status 500 (body: '{\"error\": \"grader crashed\"}')")) << e;
  next = {200, "<html>"};
  e = error_of(set, b.in);
  EXPECT_TRUE(contains(e, name + "the body is not JSON: '<html>'")) << e;
  next = {200, "{\"scores\": [1, 2, 3]}"};
  e = error_of(set, b.in);
  EXPECT_TRUE(contains(e, name + "the body is not {\"rewards\": [...]}")) << e;
  next = {200, "{\"rewards\": [1, 2]}"};
  e = error_of(set, b.in);
  EXPECT_TRUE(contains(e, name + "2 rewards for 3 inputs")) << e;
  next = {200, "{\"rewards\": [1, \"2\", 3]}"};
  e = error_of(set, b.in);
  EXPECT_TRUE(contains(e, name + "rewards[1] (for rollout 1 (p.jsonl:2)): not a number")) << e;
}

TEST(HttpReward, AHangAndARefusedConnectionAreErrors) {
  GraderServer server([](const std::string&) {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    return std::pair{200, std::string("{\"rewards\": [1, 1, 1]}")};
  });
  RewardSet slow = http_set(server.url(), 0.3);
  Batch b = three();
  const Clock::time_point t0 = Clock::now();
  std::string e = error_of(slow, b.in);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));  // generous bound on a busy machine
  EXPECT_TRUE(contains(e, "reading the response: no answer within 300 ms")) << e;
  // A port nothing listens on: one just closed.
  uint16_t port = 0;
  {
    boost::asio::io_context io;
    boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
    port = a.local_endpoint().port();
  }
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/";
  RewardSet refused = http_set(url);
  e = error_of(refused, b.in);
  EXPECT_TRUE(contains(e, "reward 'http': align.reward_url '" + url + "': connecting: ")) << e;
  EXPECT_TRUE(contains(e, "refused")) << e;
}

}  // namespace
}  // namespace nk
