// A child process with a deadline, for the commands that start other
// processes and must not hang on one (nekton autoconfig's probe and
// candidate runs under mpirun).
#pragma once
#include <string>
#include <vector>

namespace nk {

struct ChildResult {
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal ended it
  bool timed_out = false;
  bool ok() const { return !timed_out && signal == 0 && exit_code == 0; }
  std::string describe() const;  // "exit status 3", "killed after 60 s", ...
};

// Runs argv[0] (searched in PATH) with stdout and stderr to `log_path`, in a
// process group of its own. Past `timeout_s` it and every descendant (mpirun
// starts its ranks in groups of their own, so the group alone would miss
// them) are killed with SIGKILL.
ChildResult run_child(const std::vector<std::string>& argv, const std::string& log_path,
                      double timeout_s);

// The last `lines` lines of a text file ("" when unreadable).
std::string file_tail(const std::string& path, size_t lines);

}  // namespace nk
