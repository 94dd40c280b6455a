#include "align/rewards/command_reward.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <tuple>

#include "core/error.h"

extern char** environ;

namespace nk {

namespace {

constexpr size_t kErrTail = 4096;
constexpr size_t kMaxOut = size_t(256) << 20;  // a grader's stdout past this is cut off

struct Pipe {
  int fd[2] = {-1, -1};
  void close_end(int i) {
    if (fd[i] >= 0) ::close(fd[i]);
    fd[i] = -1;
  }
  ~Pipe() {
    close_end(0);
    close_end(1);
  }
};

// SIGPIPE blocked in this thread while writing to the child's stdin (a
// grader that exits without reading gives EPIPE, not a dead trainer); one
// raised here is consumed before the old mask comes back.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeBlock() {
    if (!was_pending_) {
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

void append_tail(std::string& s, const char* p, size_t n) {
  s.append(p, n);
  if (s.size() > 2 * kErrTail) s.erase(0, s.size() - kErrTail);
}

}  // namespace

CommandResult run_command(const std::string& key, const std::string& command,
                          const std::string& input, std::chrono::milliseconds timeout) {
  using clock = std::chrono::steady_clock;
  const clock::time_point deadline = clock::now() + timeout;
  Pipe in, out, err;
  for (Pipe* p : {&in, &out, &err})
    if (::pipe2(p->fd, O_CLOEXEC) != 0)
      fail("{} '{}': cannot make a pipe: {}", key, command, std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in.fd[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out.fd[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err.fd[1], 2);
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  // Its own process group, so a timeout kills what the shell started too;
  // default signal handling and no blocked signals whatever this process has.
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setflags(&at,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&at, 0);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setsigdefault(&at, &defaults);
  std::string sh = "sh", dash_c = "-c", cmd = command;
  char* argv[] = {sh.data(), dash_c.data(), cmd.data(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, "/bin/sh", &fa, &at, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (rc != 0) fail("{} '{}': cannot start /bin/sh: {}", key, command, std::strerror(rc));
  in.close_end(0);
  out.close_end(1);
  err.close_end(1);
  for (int fd : {in.fd[1], out.fd[0], err.fd[0]})
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);

  CommandResult r;
  {
    SigpipeBlock block;
    size_t written = 0;
    if (input.empty()) in.close_end(1);
    char buf[65536];
    while (out.fd[0] >= 0 || err.fd[0] >= 0) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
      if (left.count() <= 0) {
        r.timed_out = true;
        break;
      }
      pollfd fds[3];
      int n = 0;
      int at_in = -1, at_out = -1, at_err = -1;
      if (in.fd[1] >= 0) fds[at_in = n++] = {in.fd[1], POLLOUT, 0};
      if (out.fd[0] >= 0) fds[at_out = n++] = {out.fd[0], POLLIN, 0};
      if (err.fd[0] >= 0) fds[at_err = n++] = {err.fd[0], POLLIN, 0};
      const int ready = ::poll(fds, nfds_t(n), int(std::min<int64_t>(left.count(), 1000)));
      if (ready < 0 && errno != EINTR) break;
      if (ready <= 0) continue;
      if (at_in >= 0 && fds[at_in].revents) {
        const ssize_t w = ::write(in.fd[1], input.data() + written, input.size() - written);
        if (w > 0) written += size_t(w);
        // EPIPE: it stopped reading; what it wrote still counts.
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == input.size())
          in.close_end(1);
      }
      using Source = std::tuple<int, Pipe*, std::string*>;
      for (auto [at, pipe, into] : {Source{at_out, &out, &r.out}, Source{at_err, &err, &r.err}}) {
        if (at < 0 || !fds[at].revents) continue;
        const ssize_t got = ::read(pipe->fd[0], buf, sizeof buf);
        if (got > 0) {
          if (into == &r.err)
            append_tail(r.err, buf, size_t(got));
          else if (r.out.size() < kMaxOut)
            r.out.append(buf, size_t(got));
        } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
          pipe->close_end(0);
        }
      }
    }
  }
  in.close_end(1);
  // Its output is closed: wait for the exit until the deadline, then kill.
  int wstatus = 0;
  pid_t done = 0;
  while (!r.timed_out && (done = ::waitpid(pid, &wstatus, WNOHANG)) == 0) {
    if (clock::now() >= deadline)
      r.timed_out = true;
    else
      ::usleep(2000);
  }
  if (r.timed_out) {
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
    while ((done = ::waitpid(pid, &wstatus, 0)) < 0 && errno == EINTR) {
    }
  } else {
    ::kill(-pid, SIGKILL);  // whatever it left running in its group
  }
  if (done == pid) {
    if (WIFEXITED(wstatus)) r.status = WEXITSTATUS(wstatus);
    if (WIFSIGNALED(wstatus)) r.signal = WTERMSIG(wstatus);
  }
  if (r.err.size() > kErrTail) r.err.erase(0, r.err.size() - kErrTail);
  return r;
}

std::vector<double> CommandReward::score(std::span<const RewardInput> in) {
  if (in.empty()) return {};  // no process for nothing
  const std::string name = fmt::format("align.reward_command '{}'", command_);
  std::string input;
  for (const RewardInput& x : in)
    input += grader_input(x).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + '\n';
  const CommandResult r = run_command("align.reward_command", command_, input, timeout_);
  std::string err = r.err;
  while (!err.empty() && (err.back() == '\n' || err.back() == '\r')) err.pop_back();
  const std::string tail = err.empty() ? "no stderr" : "stderr: " + err;
  if (r.timed_out)
    fail("{}: no answer within {} ms (align.reward_timeout_s); its process group was killed ({})",
         name, timeout_.count(), tail);
  if (r.signal)
    fail("{}: killed by signal {} ({}) ({})", name, r.signal, ::strsignal(r.signal), tail);
  if (r.status) fail("{}: exited with status {} ({})", name, r.status, tail);
  std::vector<std::string> lines;
  std::istringstream s(r.out);
  for (std::string l; std::getline(s, l);) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
    lines.push_back(l);
  }
  if (lines.size() != in.size())
    fail("{}: wrote {} lines for {} rollouts; one number (or {{\"reward\": x}}) per input line",
         name, lines.size(), in.size());
  std::vector<double> v(in.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    try {
      v[i] = grader_reward(nlohmann::json::parse(lines[i]));
    } catch (const std::exception& e) {
      const std::string shown = lines[i].size() > 200 ? lines[i].substr(0, 200) + "..." : lines[i];
      fail("{}: output line {} ('{}', for {}): {}", name, i + 1, shown, rollout_name(in, i),
           dynamic_cast<const nlohmann::json::exception*>(&e) ? "not JSON" : e.what());
    }
  }
  return v;
}

}  // namespace nk
