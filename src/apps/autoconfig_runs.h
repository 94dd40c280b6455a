// The processes `nekton autoconfig` starts: the calibration probes (the
// recipe on one process; a two-rank all-reduce) and the measured runs of
// the best candidates, each `nekton train` of this executable under mpirun
// in a temporary folder, killed at its deadline.
#pragma once
#include <string>
#include <vector>

#include "apps/child_process.h"
#include "core/json.h"
#include "train/layout_search.h"

namespace nk {

// The two one-process probe runs: micro-batches per step, predicted compute
// and measured step (seconds) of each.
struct Calibration {
  double n1 = 0, c1 = 0, m1 = 0, n2 = 0, c2 = 0, m2 = 0;
  std::string failed;  // why the probes could not run (then the raw rates are used)
  nlohmann::json to_json() const;
  std::string summary() const;
};

struct MeasuredRun {
  ChildResult result;
  std::vector<double> steps_s;  // every step's, from metrics.jsonl
  double step_s = 0;            // the fastest step after the first
  double median_s = 0;          // the median of the steps after the first
  std::string log, log_tail;
  bool ok() const { return result.ok() && step_s > 0; }
  nlohmann::json to_json(double predicted_s) const;
};

class AutoconfigRuns {
 public:
  // recipe/overrides: as given to autoconfig; cfg: what they give. Makes
  // the temporary folder and, when the recipe names no data, a synthetic
  // corpus in it (the step time does not depend on the text).
  AutoconfigRuns(std::string recipe, std::vector<std::string> overrides, const TrainConfig& cfg,
                 double timeout_s);
  ~AutoconfigRuns();
  AutoconfigRuns(const AutoconfigRuns&) = delete;
  AutoconfigRuns& operator=(const AutoconfigRuns&) = delete;

  // Runs the recipe on one process at cal.threads, with one micro-batch per
  // step and with several, and fits cal.compute_scale and
  // cal.per_micro_batch_s (train/step_calibration.h). Measures the rates
  // the probes need into `rates`.
  Calibration calibrate_compute(const TrainConfig& cfg, MachineRates& rates, StepCalibration& cal);
  // A 4 KiB and a 4 MiB all-reduce between two ranks on this host: the
  // link's latency and bandwidth. Keeps cal's defaults (with a warning)
  // when the probe fails.
  void calibrate_link(StepCalibration& cal);
  // The cost of one collective or send inside a step (the peer's
  // scheduling, the polling wait; more than the back-to-back probe's
  // latency where ranks share cores): a tensor-parallel run of the recipe
  // on 2 ranks, one sequence per micro-batch, against the model without it.
  // Raises cal.link_latency_s to it; keeps it (with a warning) when the
  // recipe cannot run so.
  void calibrate_messages(const TrainConfig& cfg, MachineRates& rates, StepCalibration& cal);
  // The message probe: messages per step, predicted step without their
  // cost, measured step (zeros when it did not run).
  struct MessageProbe {
    double messages = 0, predicted_s = 0, measured_s = 0;
  };
  const MessageProbe& message_probe() const { return message_probe_; }
  // `steps` training steps of candidate k on `world` ranks of this host.
  MeasuredRun measure(const LayoutCandidate& k, int64_t world, int64_t steps);
  // The recipe with k's settings, as one YAML file for nekton train.
  void write_recipe(const std::string& path, const LayoutCandidate& k) const;

 private:
  // nekton train's arguments for a run in dir `name` with `extra` settings.
  std::vector<std::string> train_args(const std::string& name,
                                      const std::vector<std::string>& extra, int64_t steps) const;
  MeasuredRun run(const std::string& name, int64_t world, const std::vector<std::string>& extra,
                  int64_t steps);
  std::string recipe_;
  std::vector<std::string> overrides_;
  std::string exe_, dir_, data_;
  double timeout_s_;
  int runs_ = 0;
  MessageProbe message_probe_;
};

// `nekton autoconfig --probe-link` under mpirun: rank 0 prints
// {"latency_s": ..., "bytes_per_s": ...} (bus bandwidth of a ring all-reduce).
int probe_link_main();

}  // namespace nk
