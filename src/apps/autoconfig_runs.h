// The processes `nekton autoconfig` starts: the calibration probes (the
// recipe on one process; a two-rank all-reduce) and the measured runs of
// the best candidates, each `nekton train` of this executable under mpirun
// in a temporary folder, killed at its deadline.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "apps/child_process.h"
#include "core/json.h"
#include "train/layout_search.h"
#include "train/step_calibration.h"

namespace nk {

// The three one-process probe runs: micro-batches per step, predicted
// compute and measured step (seconds) of each.
struct Calibration {
  double n1 = 0, c1 = 0, m1 = 0, n2 = 0, c2 = 0, m2 = 0;
  // A share of the batch in one micro-batch: 1 / `share` of it (the least a
  // rank of the searched layouts computes, as far as a divisor allows).
  double n3 = 0, c3 = 0, m3 = 0;
  int64_t share = 0;
  std::string failed;  // why the probes could not run (then the raw rates are used)
  nlohmann::json to_json() const;
  std::string summary() const;
};

struct MeasuredRun {
  ChildResult result;
  std::vector<double> steps_s;  // every step's, from metrics.jsonl
  double step_s = 0;            // the median of the steps after the first (warm-up)
  double fastest_s = 0;         // the fastest step after the first
  // Several rounds' runs pooled (pool_rounds): each round's median, in order.
  std::vector<double> round_step_s;
  // The host's other work meanwhile (apps/host_load.h): its share of the
  // cores, and the load averages at the end.
  double others_share = 0;
  std::string load_averages;
  std::string log, log_tail;
  // The trainer's own account of its context parallelism (its log's
  // "context parallel: ..." line, past that prefix; empty at cp 1): the
  // cp_comm_type the run took.
  std::string context_parallel;
  bool ok() const { return result.ok() && step_s > 0; }
  nlohmann::json to_json(double predicted_s) const;
};

// One layout's runs in several rounds (--rounds) as one run: every run's
// steps after its first pooled, step_s their median (a round slowed
// throughout by other work on the host moves it little once there are three)
// and fastest_s their minimum; a failed round's result (and log) when one
// failed. `rounds` is not empty.
MeasuredRun pool_rounds(const std::vector<MeasuredRun>& rounds);

class AutoconfigRuns {
 public:
  // recipe/overrides: as given to autoconfig; cfg: what they give. Makes
  // the temporary folder and, when the recipe names no data, a synthetic
  // corpus in it (the step time does not depend on the text). A run is
  // killed past timeout_s, plus three times its predicted steps when
  // `scale_timeout` (a 124M model's FSDP probe takes minutes where a tiny
  // model's takes seconds).
  AutoconfigRuns(std::string recipe, std::vector<std::string> overrides, const TrainConfig& cfg,
                 double timeout_s, bool scale_timeout);
  ~AutoconfigRuns();
  AutoconfigRuns(const AutoconfigRuns&) = delete;
  AutoconfigRuns& operator=(const AutoconfigRuns&) = delete;

  // Runs the recipe on one process at cal.threads, with one micro-batch per
  // step, with several, and with 1 / d of the batch in one micro-batch (d
  // the largest divisor of the global batch up to `world`, at least 2: the
  // least compute a rank of a `world`-rank layout does, so that the fit
  // spans the candidates' compute), and fits cal.compute_scale,
  // cal.per_micro_batch_s and cal.per_step_s (train/step_calibration.h).
  // Measures the rates the probes need into `rates`.
  Calibration calibrate_compute(const TrainConfig& cfg, MachineRates& rates, StepCalibration& cal,
                                int64_t world);
  // The ranks' sharing of the cores: `copies` runs of the several-micro-
  // batch probe at once (as many single-rank processes as a host's ranks,
  // each on cal.threads), their median step over the probe's alone. 0 when
  // calibrate_compute had no such probe or a copy failed (with a warning).
  double measure_sharing(int64_t copies);
  // The host's drift: the several-micro-batch probe (measure_sharing's)
  // run alone once more, its median step over the calibration's. Run after
  // the measured rounds, it says how much faster or slower the host ran
  // then than while the model was calibrated (every prediction moves with
  // it). 0 when calibrate_compute had no such probe or the run failed.
  double measure_drift();
  // A 4 KiB and a 4 MiB all-reduce between two ranks on this host: the
  // link's latency and bandwidth. Keeps cal's defaults (with a warning)
  // when the probe fails.
  void calibrate_link(StepCalibration& cal);
  // The cost of the collectives inside a step (the peer's scheduling, the
  // polling wait, a large message's fragments; more than the back-to-back
  // link probe's where ranks share cores or other work loads the host): a
  // tensor-parallel run of the recipe on the host's ranks (tp 2 x dp P/2; 2
  // ranks when P is odd; one sequence per
  // micro-batch: many small collectives) and a data-parallel one (one
  // micro-batch per rank: the gradients' few large ones), each against the
  // model without communication, fitted as messages x cal.link_latency_s +
  // bytes / cal.link_bytes_per_s. Without a positive fit, the first run's
  // per-message cost past its bytes at the link probe's bandwidth; keeps
  // cal's values (with a warning) when the recipe cannot run so. Sets
  // cal.message_wait_share from the tensor-parallel run.
  void calibrate_messages(const TrainConfig& cfg, MachineRates& rates, StepCalibration& cal);
  // Ring attention's cost over the causal kernel's for the same tiles
  // (cal.ring_attention_scale) and one ring message's
  // (cal.ring_message_s): two context-parallel runs of the recipe (cp 2 x
  // dp P/2, p2p; one micro-batch per rank, then one sequence per
  // micro-batch) against the model with the link already calibrated
  // (fit_ring). Keeps cal's values (with a warning) when the recipe cannot
  // run so.
  void calibrate_ring(const TrainConfig& cfg, MachineRates& rates, StepCalibration& cal);
  // FSDP's costs past the link (cal.refault_s_per_byte, cal.fsdp_step_s):
  // what a byte its gathers write costs (the pages handed back after each
  // use faulted in again by the gather's copy, the release, the waits at
  // every gather) and what a step costs beside them. Three fully sharded
  // data-parallel runs of the recipe on the host's ranks (dp P: one
  // sequence per micro-batch, the most gathers of the recipe's batch; one
  // micro-batch per rank, the fewest; one sequence per micro-batch of
  // twice the batch, as many gathers as a layout sharded over half the
  // data-parallel ranks makes), each against the model with both costs
  // free, in two rounds (their steps pooled), fitted as gathered bytes x
  // per byte + per step by least squares (the prediction's slopes in each).
  // A fit is taken when both costs are positive and the per-byte one is at
  // least the page probe's (cal.page_refault_s_per_byte: every gather
  // writes into released pages); else, for a negative per-step cost, the
  // per-byte cost alone by least squares when at least the page probe's
  // (fit_fsdp_per_byte); failing that, the page probe's cost per byte and
  // per step the least any probe leaves past it (a probe slowed by other
  // work on the host reads slow, never fast). With one probe run only, that
  // probe per byte. Keeps cal's values (the page probe's) with a warning
  // when the recipe cannot run so. fsdp_fit() names the fit taken. On more
  // than 2 ranks (an even count), two more at tp 2 x dp P/2 (one
  // micro-batch per rank, one sequence per micro-batch), in two rounds,
  // give both costs in a sharding group of 2 (cal.fsdp_pair_step_s,
  // cal.fsdp_pair_refault_s_per_byte; fsdp_pair_fit() names the fit): on 4
  // ranks sharing 2 cores the 4-rank group's per-step cost overcharged a
  // layout sharded over 2 by 43 %, its per-byte cost by 24-40 %.
  void calibrate_fsdp(const TrainConfig& cfg, MachineRates& rates, StepCalibration& cal);
  // ZeRO-2's per-micro-batch cost (cal.zero2_micro_batch_s): a run of the
  // recipe at dp P (the most ranks the batch splits over), parallel.shard=
  // grads, one sequence per micro-batch (the most reductions), in two rounds
  // pooled, against the model without that cost: what it adds over its
  // micro-batches (and so whatever else the model misses at dp P); on more
  // than 2 ranks (an even count) a second at tp 2 x dp P/2, the cost in a
  // sharding group of 2 (cal.zero2_pair_micro_batch_s). Each the cost at
  // which the model predicts its probe's step (bisected: the model bends
  // where the messages' wait is capped and where recomputed forwards hide
  // the wait). Keeps 0 (with a warning) when the recipe cannot run so.
  void calibrate_zero2(const TrainConfig& cfg, MachineRates& rates, StepCalibration& cal);
  // A fully sharded probe: its tensor-parallel size (1: dp P; 2: the
  // pair probes, tp 2 x dp P/2, after the others), micro-batch and global
  // batch, predicted step with FSDP's costs free, measured step, the step
  // predicted at the costs fitted (its group's: the pair's for tp 2), and
  // what a unit of refault_s_per_byte and of fsdp_step_s add to that
  // (seconds per unit; the slopes at the fit).
  struct FsdpProbe {
    int64_t tp = 1, micro_batch = 0, global_batch = 0;
    double predicted_s = 0, measured_s = 0, fitted_s = 0, per_s_per_byte = 0, per_step_s = 0;
  };
  const std::vector<FsdpProbe>& fsdp_probes() const { return fsdp_probes_; }
  // "N probes, two rounds" ("N probes" when a probe of the second round
  // failed), "N probes per byte alone", "page probe per byte, the probes per
  // step", "one probe per byte" or "page probe".
  const std::string& fsdp_fit() const { return fsdp_fit_; }
  // The pair's: "two probes", "two probes per byte alone", "the group's
  // per byte, one probe per step", or empty (no pair probe ran).
  const std::string& fsdp_pair_fit() const { return fsdp_pair_fit_; }
  // A context-parallel probe: its micro-batch, predicted step with the
  // ring at scale 1 and free messages, measured step, and what fit_ring
  // took from it.
  struct CpProbe {
    int64_t micro_batch = 0;
    double predicted_s = 0, measured_s = 0;
    RingProbe fit;
  };
  const std::vector<CpProbe>& ring_probes() const { return ring_probes_; }
  // A message probe: messages and bytes per step, predicted step without
  // their cost, measured step (zeros when it did not run).
  struct MessageProbe {
    double messages = 0, bytes = 0, predicted_s = 0, measured_s = 0;
  };
  const MessageProbe& message_probe() const { return message_probe_; }
  const MessageProbe& bytes_probe() const { return bytes_probe_; }
  // The ZeRO-2 probe (calibrate_zero2): its micro-batches per rank,
  // predicted step without the per-micro-batch cost, measured step (zeros
  // when it did not run).
  struct Zero2Probe {
    double micro_batches = 0, predicted_s = 0, measured_s = 0;
  };
  const Zero2Probe& zero2_probe() const { return zero2_probe_; }
  // The one at tp 2 x dp P/2 on more than 2 ranks (zeros when it did not
  // run).
  const Zero2Probe& zero2_pair_probe() const { return zero2_pair_probe_; }
  // `steps` training steps of candidate k on `world` ranks of this host.
  MeasuredRun measure(const LayoutCandidate& k, int64_t world, int64_t steps);
  // The recipe with k's settings, as one YAML file for nekton train.
  void write_recipe(const std::string& path, const LayoutCandidate& k) const;

 private:
  // nekton train's arguments for a run in dir `name` with `extra` settings,
  // its collectives giving up after `deadline_s`.
  std::vector<std::string> train_args(const std::string& name,
                                      const std::vector<std::string>& extra, int64_t steps,
                                      double deadline_s) const;
  // A run, `expected_step_s` its predicted step (for its deadline).
  MeasuredRun run(const std::string& name, int64_t world, const std::vector<std::string>& extra,
                  int64_t steps, double expected_step_s);
  std::string recipe_;
  std::vector<std::string> overrides_;
  std::string exe_, dir_, data_;
  double timeout_s_;
  bool scale_timeout_;
  int runs_ = 0;
  MessageProbe message_probe_, bytes_probe_;
  Zero2Probe zero2_probe_, zero2_pair_probe_;
  std::vector<CpProbe> ring_probes_;
  std::vector<FsdpProbe> fsdp_probes_;
  std::string fsdp_fit_ = "page probe", fsdp_pair_fit_;
  std::vector<std::string> sharing_probe_;  // the several-micro-batch probe's settings
  double sharing_alone_s_ = 0;              // and its median step alone
  std::map<int64_t, double> sharing_;       // measured, by copies
};

// `nekton autoconfig --probe-link` under mpirun: rank 0 prints
// {"latency_s": ..., "bytes_per_s": ...} (bus bandwidth of a ring all-reduce).
int probe_link_main();

}  // namespace nk
