// A reward computed by an external program, for graders written in any
// language (align.reward_command). Per score() call one process runs the
// command line through /bin/sh -c, in its own process group, and
//   stdin   one JSON object per rollout per line (grader_input: the record's
//           fields, "prompt", "completion", "completion_tokens", "truncated"),
//           then end of file
//   stdout  one line per rollout, in order: a number or {"reward": x}
// The data reaches it only through stdin (never the command line); what it
// leaves running in its process group when it exits is killed. It must
// exit 0 within the timeout: a non-zero status, a signal, a hang (its whole
// process group is killed at the deadline and reaped), a wrong count of
// lines or a line that is not a number is an nk::Error naming the command,
// the line, and the status or signal with the tail of its stderr.
#pragma once
#include <chrono>
#include <string>

#include "align/rewards/reward_function.h"

namespace nk {

// What a run of a command gave back.
struct CommandResult {
  int status = 0;          // exit status when exited, else 0
  int signal = 0;          // the signal that ended it, else 0
  bool timed_out = false;  // killed at the deadline
  std::string out, err;    // stdout whole; stderr's last 4 KiB
};

// Runs `command` through /bin/sh -c with `input` on stdin, collecting its
// output until it exits or `timeout` passes (then its process group is
// killed). The child is always reaped before this returns. nk::Error naming
// `key` only when the process cannot be started.
CommandResult run_command(const std::string& key, const std::string& command,
                          const std::string& input, std::chrono::milliseconds timeout);

class CommandReward : public RewardFunction {
 public:
  CommandReward(std::string command, std::chrono::milliseconds timeout)
      : command_(std::move(command)), timeout_(timeout) {}
  std::vector<double> score(std::span<const RewardInput> in) override;

 private:
  std::string command_;
  std::chrono::milliseconds timeout_;
};

}  // namespace nk
