// Helpers shared by the test suites: a scratch folder per test, whole-file I/O,
// running a command (the nekton binary, node, python) to capture its output,
// and the message of the nk::Error a call throws.
#pragma once
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "test_paths.h"

namespace nk::test {

namespace fs = std::filesystem;

// A fresh folder under the system temp dir, removed with the object.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "nk") {
    path_ = fs::temp_directory_path() /
            (tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  // A fresh, empty folder `name` inside this one.
  fs::path fresh(const std::string& name) const {
    fs::path d = path_ / name;
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }
  // The names of what this folder holds, sorted.
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (auto& e : fs::directory_iterator(path_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  fs::path path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct RunResult {
  int code;         // exit status, -1 if killed by a signal
  std::string out;  // stdout (and stderr when merged)
};

// Runs `cmd` through the shell; stderr is merged into out unless merge_stderr is false.
inline RunResult run_command(const std::string& cmd, bool merge_stderr = true) {
  FILE* p = popen((merge_stderr ? cmd + " 2>&1" : cmd).c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  std::array<char, 65536> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// The "loss" of every record of a training run's metrics.jsonl, in order.
inline std::vector<double> logged_losses(const std::string& metrics_jsonl) {
  std::vector<double> out;
  std::istringstream in(read_file(metrics_jsonl));
  std::string line;
  while (std::getline(in, line)) {
    auto at = line.find("\"loss\": ");
    if (at != std::string::npos) out.push_back(std::stod(line.substr(at + 8)));
  }
  return out;
}

// The set-up fetches the reference tokenizers, vocabularies and llama.cpp
// (scripts/fetch_assets.sh --test) and installs Python's torch: their absence is a
// broken set-up, so it fails the test rather than skipping it.
#define NK_REQUIRE_ASSET(present, what)                       \
  if (!(present))                                             \
  GTEST_FAIL() << (what)                                      \
               << " is missing: run scripts/setup.sh --test " \
                  "(the set-up of `make test` runs it)"

// The nekton binary of this build.
inline std::string nekton_bin() {
  return std::string(NK_BINARY_DIR) + "/bin/nekton";
}

// Starts nekton with `args` in the background, its output going to `log`.
inline pid_t spawn_nekton(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> full = {nekton_bin()};
  full.insert(full.end(), args.begin(), args.end());
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (auto& a : full) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// Runs `nekton <args>`; stderr is merged into out, or discarded when
// merge_stderr is false.
inline RunResult run_nekton(const std::string& args, bool merge_stderr = true) {
  return run_command(nekton_bin() + " " + args + (merge_stderr ? "" : " 2>/dev/null"),
                     merge_stderr);
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The message of the nk::Error that f() throws, or "(no error)" if it returns.
template <class F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const ::nk::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Waits up to `seconds` until `path` exists and is not empty (a lock file a
// run has written its pid into); its contents, or "" on timeout.
inline std::string wait_for_file(const std::string& path, double seconds = 60) {
  for (int i = 0; i < int(seconds * 100); ++i) {
    std::string s = read_file(path);
    if (!s.empty()) return s;
    ::usleep(10000);
  }
  return "";
}

// Names under `dir` (recursively) that only a killed or live writer leaves:
// temporaries (NAME.tmp.<pid>, a checkpoint's .tmp.* and .trash.* folders)
// and lock files.
inline std::vector<std::string> leftover_files(const std::string& dir) {
  std::vector<std::string> odd;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::string n = it->path().filename().string();
    if (is_temporary_name(n) || n.rfind(".tmp.", 0) == 0 || n.rfind(".trash.", 0) == 0 ||
        (n.size() > 5 && n.compare(n.size() - 5, 5, ".lock") == 0))
      odd.push_back(fs::relative(it->path(), dir).string());
  }
  std::sort(odd.begin(), odd.end());
  return odd;
}

}  // namespace nk::test
