// train.profile: where a training step's time goes, kernel by kernel (the
// CPU kernels' self times from ops/kernel_profile.h; on CUDA each kernel's
// device time between events around its calls), as a mean over the
// steps after the run's first (primitive creation, first-touch page faults),
// with what no kernel accounts for (communication, allocation, the
// framework's own work) as its own line.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/kernel_profile.h"

namespace nk {

class StepProfile {
 public:
  // off: every call does nothing. On, the kernels are timed until
  // destruction; `device` is where the model's kernels run (the report's label).
  explicit StepProfile(bool on, Device device = kHost);
  ~StepProfile();
  StepProfile(const StepProfile&) = delete;
  StepProfile& operator=(const StepProfile&) = delete;

  bool on() const { return on_; }
  // Around each step: counters cleared at its start; at its end (before
  // validation and logging) its kernels and `seconds` added, unless it is
  // the run's first.
  void begin_step();
  void end_step(double seconds);

  // The table: the log lines, and OUT_DIR/profile.json when `path` is not empty.
  // Nothing when fewer than two steps ran. `rank` of `world` > 1: each
  // rank's table is headed with its rank (a pipeline's stages, or a rank
  // waiting on its peers, differ) and `gather` (every rank calls report)
  // brings them to rank 0, which prints them in rank order.
  using Gather = std::function<std::vector<std::string>(const std::string&)>;
  void report(const std::string& path, int64_t rank = 0, int64_t world = 1,
              const Gather& gather = {}) const;

  struct Row {
    std::string name;
    double calls = 0, seconds = 0;  // totals over the counted steps
  };
  // The counted steps' kernels, slowest first; their number and total time.
  const std::vector<Row>& rows() const { return rows_; }
  int64_t steps() const { return steps_; }
  double step_seconds() const { return seconds_; }

 private:
  bool on_;
  Device device_;
  bool first_ = true;
  int64_t steps_ = 0;
  double seconds_ = 0;
  std::vector<Row> rows_;
};

}  // namespace nk
