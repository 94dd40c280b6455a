#include "apps/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"

namespace nk {

namespace fs = std::filesystem;

std::string ChildResult::describe() const {
  if (timed_out) return "killed at its deadline (timed out)";
  if (signal) return fmt::format("killed by signal {} ({})", signal, ::strsignal(signal));
  return fmt::format("exit status {}", exit_code);
}

namespace {

// Every live process's parent, from /proc/PID/stat (the field after the
// command's closing parenthesis and the state).
std::multimap<pid_t, pid_t> children_by_parent() {
  std::multimap<pid_t, pid_t> m;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator("/proc", ec)) {
    const std::string name = d.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(d.path() / "stat");
    std::string stat;
    std::getline(f, stat);
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2)
      m.emplace(pid_t(ppid), pid_t(std::stoi(name)));
  }
  return m;
}

void kill_tree(pid_t root) {
  const std::multimap<pid_t, pid_t> kids = children_by_parent();
  std::deque<pid_t> todo{root};
  std::vector<pid_t> all;
  while (!todo.empty()) {
    const pid_t p = todo.front();
    todo.pop_front();
    all.push_back(p);
    auto [lo, hi] = kids.equal_range(p);
    for (auto it = lo; it != hi; ++it) todo.push_back(it->second);
  }
  for (pid_t p : all) ::kill(p, SIGKILL);
  ::kill(-root, SIGKILL);
}

}  // namespace

ChildResult run_child(const std::vector<std::string>& argv, const std::string& log_path,
                      double timeout_s) {
  const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("{}: cannot write ({})", log_path, std::strerror(errno));
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (std::string& s : args) cargs.push_back(s.data());
  cargs.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    fail("cannot start {}: {}", argv[0], std::strerror(errno));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const int in = ::open("/dev/null", O_RDONLY);
    if (in >= 0) ::dup2(in, 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);  // the parent may block SIGTERM/SIGINT
    ::execvp(cargs[0], cargs.data());
    const std::string msg = fmt::format("cannot start {}: {}\n", argv[0], std::strerror(errno));
    [[maybe_unused]] ssize_t w = ::write(2, msg.data(), msg.size());
    ::_exit(127);
  }
  ::close(fd);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  ChildResult r;
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) fail("waiting for {}: {}", argv[0], std::strerror(errno));
    if (std::chrono::steady_clock::now() > deadline) {
      r.timed_out = true;
      kill_tree(pid);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  if (!r.timed_out) ::kill(-pid, SIGKILL);  // whatever it left running in its group
  return r;
}

std::string file_tail(const std::string& path, size_t lines) {
  std::ifstream f(path);
  std::deque<std::string> last;
  for (std::string l; std::getline(f, l);) {
    last.push_back(l);
    if (last.size() > lines) last.pop_front();
  }
  std::string out;
  for (const std::string& l : last) out += l + "\n";
  return out;
}

}  // namespace nk
