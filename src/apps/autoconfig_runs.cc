#include "apps/autoconfig_runs.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string_view>
#include <thread>

#include "apps/autoconfig_probe.h"
#include "apps/host_load.h"
#include "apps/mpirun_launch.h"
#include "core/atomic_file.h"
#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/tensor.h"
#include "dist/mpi/runtime.h"
#include "train/step_calibration.h"

namespace nk {

namespace fs = std::filesystem;

namespace autoconfig {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int64_t divisor_at_most(int64_t n, int64_t cap) {
  for (int64_t d = std::min(n, std::max<int64_t>(1, cap)); d > 1; --d)
    if (n % d == 0) return d;
  return 1;
}

TrainConfig probe_config(const TrainConfig& cfg, int tp, int cp, int dp, int64_t mb) {
  TrainConfig c = cfg;
  c.parallel.mesh = dist::MeshSpec{};
  c.parallel.mesh.tp = tp;
  c.parallel.mesh.cp = cp;
  c.parallel.mesh.dp = dp;
  c.parallel.set_cp_comm("p2p");
  c.parallel.vp = 1;
  c.parallel.pp_layout.clear();
  c.parallel.sequence_parallel = false;
  c.ddp.shard = parallel::Shard::None;
  c.micro_batch = mb;
  return c;
}
std::vector<std::string> probe_overrides(int tp, int cp, int dp, int64_t mb, int64_t threads) {
  return {fmt::format("parallel.tp={}", tp),
          "parallel.pp=1",
          fmt::format("parallel.cp={}", cp),
          fmt::format("parallel.dp={}", dp),
          "parallel.ep=1",
          "parallel.vp=1",
          "parallel.pp_layout=",
          "parallel.sp=false",
          "parallel.shard=none",
          "parallel.cp_comm_type=p2p",
          "parallel.hierarchical_context_parallel_sizes=",
          fmt::format("train.micro_batch={}", mb),
          fmt::format("train.threads={}", threads)};
}

TrainEstimate probe_estimate(const TrainConfig& c, int64_t P, MachineRates& rates) {
  c.parallel.check();
  measure_missing_rates(c, rates);
  return estimate_training(c, P, &rates);
}

}  // namespace autoconfig

using autoconfig::divisor_at_most;
using autoconfig::kProbeSteps;
using autoconfig::median;
using autoconfig::probe_config;
using autoconfig::probe_estimate;
using autoconfig::probe_overrides;

nlohmann::json Calibration::to_json() const {
  nlohmann::json j = {
      {"one_micro_batch", {{"micro_batches", n1}, {"predicted_compute_s", c1}, {"measured_s", m1}}},
      {"several_micro_batches",
       {{"micro_batches", n2}, {"predicted_compute_s", c2}, {"measured_s", m2}}},
      {"batch_share",
       {{"share", share}, {"micro_batches", n3}, {"predicted_compute_s", c3}, {"measured_s", m3}}}};
  if (!failed.empty()) j["failed"] = failed;
  return j;
}

std::string Calibration::summary() const {
  if (!failed.empty()) return "failed: " + failed;
  return fmt::format(
      "{:.0f} micro-batch {:.1f} ms, {:.0f} micro-batches {:.1f} ms, 1/{} of the batch {:.1f} ms",
      n1, m1 * 1e3, n2, m2 * 1e3, share, m3 * 1e3);
}

nlohmann::json MeasuredRun::to_json(double predicted_s) const {
  nlohmann::json j = {{"ok", ok()},
                      {"log", log},
                      {"steps_s", steps_s},
                      {"others_cpu_share", others_share},
                      {"load_averages", load_averages}};
  if (!context_parallel.empty()) j["context_parallel"] = context_parallel;
  if (!round_step_s.empty()) j["round_step_s"] = round_step_s;
  if (ok()) {
    j["step_s"] = step_s;
    j["fastest_step_s"] = fastest_s;
    j["error"] = (predicted_s - step_s) / step_s;
  } else {
    j["failure"] = result.describe();
    j["log_tail"] = log_tail;
  }
  return j;
}

MeasuredRun pool_rounds(const std::vector<MeasuredRun>& rounds) {
  for (const MeasuredRun& r : rounds)
    if (!r.ok()) return r;
  MeasuredRun m = rounds.back();
  m.steps_s.clear();
  std::vector<double> timed;
  for (const MeasuredRun& r : rounds) {
    m.steps_s.insert(m.steps_s.end(), r.steps_s.begin(), r.steps_s.end());
    timed.insert(timed.end(), r.steps_s.begin() + 1, r.steps_s.end());
    m.round_step_s.push_back(r.step_s);
  }
  m.step_s = median(timed);
  m.fastest_s = *std::min_element(timed.begin(), timed.end());
  double share = 0;
  for (const MeasuredRun& r : rounds) share += r.others_share;
  m.others_share = share / double(rounds.size());
  return m;
}

AutoconfigRuns::AutoconfigRuns(std::string recipe, std::vector<std::string> overrides,
                               const TrainConfig& cfg, double timeout_s, bool scale_timeout)
    : recipe_(std::move(recipe)),
      overrides_(std::move(overrides)),
      timeout_s_(timeout_s),
      scale_timeout_(scale_timeout) {
  std::error_code ec;
  exe_ = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec) fail("autoconfig: cannot find this executable's path: {}", ec.message());
  dir_ = (fs::temp_directory_path() / fmt::format("nekton-autoconfig-{}", ::getpid())).string();
  fs::create_directories(dir_);
  if (::geteuid() == 0) {  // OpenMPI refuses root without these
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  if (cfg.data.path.empty() && !cfg.data.indexed() && !cfg.data.sft()) {
    // Words of a small vocabulary, byte-level tokens: enough for every
    // run's steps twice over, and for the validation share.
    data_ = dir_ + "/synthetic.txt";
    const int64_t want = std::max<int64_t>(1 << 20, 4 * cfg.global_batch * (cfg.seq_len + 1) * 64);
    static const char* words[] = {"the ",    "model ", "learns ", "from ",  "tokens ", "and ",
                                  "layers ", "split ", "over ",   "ranks ", "in ",     "steps "};
    std::mt19937 rng(7);
    std::string text;
    text.reserve(size_t(want) + 16);
    while (int64_t(text.size()) < want) text += words[rng() % 12];
    write_file_atomic(data_, text);
  }
}

AutoconfigRuns::~AutoconfigRuns() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::vector<std::string> AutoconfigRuns::train_args(const std::string& name,
                                                    const std::vector<std::string>& extra,
                                                    int64_t steps, double deadline_s) const {
  std::vector<std::string> args = {exe_, "train"};
  if (!recipe_.empty()) args.insert(args.end(), {"--config", recipe_});
  args.insert(args.end(), overrides_.begin(), overrides_.end());
  if (!data_.empty()) args.push_back("data.path=" + data_);
  args.insert(args.end(), extra.begin(), extra.end());
  // Timing only: no validation, no GEMM-peak probe, no event file, no
  // checkpoint or model at the end (a 124M model's is 1.4 GB a run), a
  // fresh run; the collectives give up with the run's deadline.
  args.insert(args.end(),
              {fmt::format("train.out_dir={}/{}", dir_, name), fmt::format("train.steps={}", steps),
               "train.exit_at_step=0", "train.val_every=0", "train.save_every=0",
               "train.save_final=false", "train.log_every=1", "train.peak_tflops=1",
               "train.tensorboard=false", "train.resume=never", "train.resume_from=",
               "train.eval_tasks=", fmt::format("parallel.timeout_s={}", deadline_s)});
  return args;
}

MeasuredRun AutoconfigRuns::run(const std::string& name, int64_t world,
                                const std::vector<std::string>& extra, int64_t steps,
                                double expected_step_s) {
  const double deadline_s =
      timeout_s_ + (scale_timeout_ ? 3.0 * double(steps) * std::max(0.0, expected_step_s) : 0.0);
  std::vector<std::string> argv = train_args(name, extra, steps, deadline_s);
  if (world > 1) {  // placed as nekton train --nproc places them
    std::vector<std::string> mpi = {"mpirun", "-np", std::to_string(world)};
    for (std::string& a : mpirun_placement(int(world))) mpi.push_back(std::move(a));
    argv.insert(argv.begin(), mpi.begin(), mpi.end());
  }
  MeasuredRun m;
  m.log = dir_ + "/" + name + ".log";
  const HostCpuSample before = sample_host_cpu();
  m.result = run_child(argv, m.log, deadline_s);
  m.others_share = others_cpu_share(before, sample_host_cpu());
  m.load_averages = load_averages();
  {
    constexpr std::string_view kCp = "context parallel: ";
    std::ifstream lf(m.log);
    for (std::string line; std::getline(lf, line);)
      if (const size_t at = line.find(kCp); at != std::string::npos) {
        m.context_parallel = line.substr(at + kCp.size());
        break;
      }
  }
  std::ifstream f(dir_ + "/" + name + "/metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("step_ms") && j["step_ms"].is_number())
        m.steps_s.push_back(j["step_ms"].get<double>() / 1e3);
    } catch (const nlohmann::json::exception&) {
    }
  }
  // The median of the steps after the first (which allocates and warms
  // the caches): the probes and the measured runs alike, so a step or two
  // slowed by other work on the host moves neither.
  if (m.steps_s.size() > 1) {
    m.step_s = median({m.steps_s.begin() + 1, m.steps_s.end()});
    m.fastest_s = *std::min_element(m.steps_s.begin() + 1, m.steps_s.end());
  }
  // The run folder (its metrics, read above) goes now, not with the
  // temporary folder at the end: what a run killed at its deadline left
  // there would otherwise add up over dozens of runs.
  {
    std::error_code ec;
    fs::remove_all(fs::path(dir_) / name, ec);
  }
  if (!m.ok()) {
    m.log_tail = file_tail(m.log, 12);
    // The log goes with the temporary folder: keep a copy beside it.
    const std::string keep =
        (fs::temp_directory_path() / fmt::format("nekton-autoconfig-{}-{}.log", ::getpid(), name))
            .string();
    std::error_code ec;
    fs::copy_file(m.log, keep, fs::copy_options::overwrite_existing, ec);
    if (!ec) m.log = keep;
  }
  return m;
}

Calibration AutoconfigRuns::calibrate_compute(const TrainConfig& cfg, MachineRates& rates,
                                              StepCalibration& cal, int64_t world) {
  Calibration p;
  cal.probe_recompute = recompute_overhead(cfg);
  const int64_t G = cfg.global_batch;
  // The second probe: as many micro-batches as it takes for their cost to
  // stand out of the noise (every sequence its own, up to 16 per step).
  const int64_t mb2 = divisor_at_most(G, std::max<int64_t>(1, G / 16));
  // gb: the probe's global batch (the third probe's 1 / share of the
  // recipe's).
  // The second round of a probe pools its steps with the first's (`pooled`:
  // the steps after each run's first).
  int round = 1;
  std::map<std::pair<int64_t, int64_t>, std::vector<double>> pooled;
  auto probe = [&](int64_t mb, int64_t gb, double& n, double& c, double& m) {
    TrainConfig pc = probe_config(cfg, 1, 1, 1, mb);
    pc.global_batch = gb;
    measure_missing_rates(pc, rates);
    n = double(gb / mb);
    c = estimate_training(pc, 1, &rates).step.total();
    std::vector<std::string> extra = probe_overrides(1, 1, 1, mb, cal.threads);
    extra.push_back(fmt::format("train.global_batch={}", gb));
    const MeasuredRun r =
        run(fmt::format("probe-mb{}-gb{}{}", mb, gb, round > 1 ? fmt::format("-{}", round) : ""), 1,
            extra, kProbeSteps, c * std::max(1.0, cal.compute_scale));
    if (!r.ok())
      p.failed = fmt::format("the one-process run at micro-batch {} of {} ({}): {}", mb, gb,
                             r.result.describe(), r.log);
    std::vector<double>& steps = pooled[{mb, gb}];
    if (r.ok()) steps.insert(steps.end(), r.steps_s.begin() + 1, r.steps_s.end());
    m = r.ok() ? median(steps) : r.step_s;
    // The core-sharing probe (measure_sharing): the several-micro-batch one.
    if (r.ok() && gb == G && (mb == mb2 || sharing_probe_.empty()))
      sharing_probe_ = extra, sharing_alone_s_ = m;
    return r.ok();
  };
  if (!probe(G, G, p.n1, p.c1, p.m1)) {
    NK_WARN("autoconfig: calibration probe failed, {}; using the raw rates", p.failed);
    return p;
  }
  if (mb2 == G) {  // one sequence per step: no second point, no overhead term
    cal.compute_scale = p.m1 / p.c1;
    return p;
  }
  if (!probe(mb2, G, p.n2, p.c2, p.m2)) {
    NK_WARN("autoconfig: calibration probe failed, {}; using the first probe only", p.failed);
    cal.compute_scale = p.m1 / p.c1;
    return p;
  }
  // The third: 1 / share of the batch in one micro-batch, so the compute
  // differs and the per-step cost separates from it; as little as a rank
  // of the layouts computes, so that their steps lie between the probes'.
  p.share = divisor_at_most(G, std::max<int64_t>(2, world));
  const int64_t small = G / p.share;
  if (p.share < 2 || !probe(small, small, p.n3, p.c3, p.m3)) {
    if (p.share >= 2)
      NK_WARN("autoconfig: calibration probe failed, {}; no per-step cost", p.failed);
    p.failed.clear();
    fit_compute(cal, p.n1, p.c1, p.m1, p.n2, p.c2, p.m2);
    return p;
  }
  const double n[3] = {p.n1, p.n2, p.n3}, c[3] = {p.c1, p.c2, p.c3};
  double m[3] = {p.m1, p.m2, p.m3};
  // A second round, in reverse order, fitted on the medians of both rounds'
  // steps: the three-way fit trades the scale against the per-step cost,
  // so a few per cent of noise in one probe moves both by tens of per cent
  // (four calibrations in a row on 4 ranks, one round each: scale 0.83-1.22,
  // per-step cost 0-104 ms); a drift of the host between the probes falls
  // on all three. A probe that fails now leaves the first round's figures.
  ++round;
  double again[3], n_again, c_again;
  if (probe(small, small, n_again, c_again, again[2]) &&
      probe(mb2, G, n_again, c_again, again[1]) && probe(G, G, n_again, c_again, again[0])) {
    p.m1 = m[0] = again[0], p.m2 = m[1] = again[1], p.m3 = m[2] = again[2];
  } else {
    NK_WARN("autoconfig: calibration probe failed in the second round, {}; fitted on the first",
            p.failed);
    p.failed.clear();
  }
  if (fit_step(cal, n, c, m)) return p;
  p.failed.clear();
  NK_WARN(
      "autoconfig: the three probes ({:.1f}, {:.1f}, {:.1f} ms, two rounds) gave a negative cost "
      "(noise); fitted from the first two without a per-step cost",
      m[0] * 1e3, m[1] * 1e3, m[2] * 1e3);
  return p;
}

double AutoconfigRuns::measure_sharing(int64_t copies) {
  if (copies <= 1) return 1.0;
  if (sharing_alone_s_ <= 0) return 0;
  if (sharing_.count(copies)) return sharing_.at(copies);
  // Started together from threads of this process (run_child waits for its
  // own child only), each in its own folder.
  std::vector<MeasuredRun> r(static_cast<size_t>(copies));
  std::vector<std::thread> pool;
  for (int64_t i = 0; i < copies; ++i)
    pool.emplace_back([&, i] {
      r[size_t(i)] = run(fmt::format("probe-share{}-{}", copies, i), 1, sharing_probe_, kProbeSteps,
                         double(copies) * sharing_alone_s_);
    });
  for (std::thread& t : pool) t.join();
  std::vector<double> steps;
  for (const MeasuredRun& m : r) {
    if (!m.ok()) {
      NK_WARN("autoconfig: a copy of the core-sharing probe failed ({}, {})", m.result.describe(),
              m.log);
      return 0;
    }
    steps.push_back(m.step_s);
  }
  return sharing_[copies] = median(steps) / sharing_alone_s_;
}

double AutoconfigRuns::measure_drift() {
  if (sharing_alone_s_ <= 0) return 0;
  const MeasuredRun r = run("probe-drift", 1, sharing_probe_, kProbeSteps, sharing_alone_s_);
  if (!r.ok()) {
    NK_WARN("autoconfig: the drift probe failed ({}, {})", r.result.describe(), r.log);
    return 0;
  }
  return r.step_s / sharing_alone_s_;
}

void AutoconfigRuns::calibrate_messages(const TrainConfig& cfg, MachineRates& rates,
                                        StepCalibration& cal) {
  // Two runs of the recipe on this host's ranks, each against the model without
  // communication: tensor parallel with one sequence per micro-batch (the
  // most collectives a step can make, each small) and data parallel with
  // one micro-batch per rank (the gradients' all-reduce: few collectives,
  // many bytes). Their extra times fit messages x per-message cost + bytes
  // / bandwidth: the collectives of a real step at the sizes the layouts
  // use (the peer's scheduling, the polling wait, a large message's
  // fragments; more than the back-to-back link probe sees where ranks share
  // cores or other work loads the host). (Two tensor-parallel runs would
  // not do: one recipe's tensor-parallel steps move the same bytes at any
  // micro-batch.) When the fit is not positive (noise), or the data-parallel
  // run cannot be made, the per-message cost comes from the first run
  // alone, its bytes at the link probe's bandwidth.
  // On all the host's ranks (P, when even; else 2): a collective among 4
  // ranks on 2 cores waits for more of them to be scheduled than one
  // between 2. The tensor-parallel run is tp 2 x dp P/2.
  const int64_t P = cal.procs_per_node % 2 == 0 ? cal.procs_per_node : 2;
  StepCalibration none = cal;
  none.link_latency_s = 0;
  none.link_bytes_per_s = 1e30;
  none.procs_per_node = P;
  none.sharing = measure_sharing(P);  // (cached: the host's)
  // A second round pools its steps with the first's, as calibrate_compute.
  int round = 1;
  std::map<int64_t, std::vector<double>> pooled;  // by tp
  auto probe = [&](int64_t tp, int64_t mb, MessageProbe& out) {
    TrainConfig c = probe_config(cfg, int(tp), 1, int(P / tp), mb);
    StepPrediction p;
    try {
      p = predict_step(c, probe_estimate(c, P, rates), none);
    } catch (const Error& e) {
      NK_WARN("autoconfig: no tensor-parallel probe for this recipe ({}); {:.0f} us per message",
              e.what(), cal.link_latency_s * 1e6);
      return false;
    }
    const MeasuredRun r =
        run(fmt::format("probe-tp{}-mb{}{}", tp, mb, round > 1 ? fmt::format("-{}", round) : ""), P,
            probe_overrides(int(tp), 1, int(P / tp), mb, cal.threads), kProbeSteps, p.total());
    if (!r.ok()) {
      NK_WARN("autoconfig: the tensor-parallel probe failed ({}, {}); {:.0f} us per message",
              r.result.describe(), r.log, cal.link_latency_s * 1e6);
      return false;
    }
    std::vector<double>& steps = pooled[tp];
    steps.insert(steps.end(), r.steps_s.begin() + 1, r.steps_s.end());
    out = {p.messages, p.comm_bytes, p.total(), median(steps)};
    return true;
  };
  if (!probe(2, 1, message_probe_)) return;
  const MessageProbe& m = message_probe_;
  const int64_t G = cfg.global_batch;
  if (G % P == 0 && probe(1, G / P, bytes_probe_)) {
    const MessageProbe& d = bytes_probe_;
    double em = 0, ed = 0, L = -1, beta = -1;
    auto fit = [&] {
      em = m.measured_s - m.predicted_s, ed = d.measured_s - d.predicted_s;
      const double det = m.messages * d.bytes - d.messages * m.bytes;
      L = det != 0 ? (em * d.bytes - ed * m.bytes) / det : -1;
      beta = det != 0 ? (m.messages * ed - d.messages * em) / det : -1;
      return L > 0 && beta > 0;
    };
    // Both once more, in reverse order, their steps pooled with the
    // first's: one run on ranks sharing cores can read tens of per cent
    // slow throughout, and the fit splits a small difference (one round
    // each, four 4-rank grids in a row on the Zen 5 VM: 8-82 us a message).
    ++round;
    if (!probe(1, G / P, bytes_probe_) || !probe(2, 1, message_probe_))
      NK_WARN("autoconfig: a message probe failed in the second round; fitted on what ran");
    if (fit()) {
      cal.link_latency_s = L;
      cal.link_bytes_per_s = 1.0 / beta;
      cal.message_wait_share = m.messages * L / m.predicted_s;
      return;
    }
    NK_WARN(
        "autoconfig: the tensor- and data-parallel probes ({:.1f} and {:.1f} ms past the model, "
        "two rounds) give no positive per-message and per-byte cost (noise); the per-message "
        "cost from the first, the bandwidth from the link probe",
        em * 1e3, ed * 1e3);
  } else {
    ++round;  // the tensor-parallel probe alone: once more, pooled
    if (!probe(2, 1, message_probe_))
      NK_WARN("autoconfig: the tensor-parallel probe failed in the second round; fitted on one");
  }
  cal.link_latency_s =
      std::max(cal.link_latency_s, (m.measured_s - m.predicted_s - m.bytes / cal.link_bytes_per_s) /
                                       std::max(1.0, m.messages));
  cal.message_wait_share = m.messages * cal.link_latency_s / m.predicted_s;
}

void AutoconfigRuns::calibrate_link(StepCalibration& cal) {
  const std::string log = dir_ + "/probe-link.log";
  const ChildResult r = run_child(mpirun_command(2, exe_, {"autoconfig", "--probe-link"}), log,
                                  std::min(timeout_s_, 120.0));
  std::ifstream f(log);
  for (std::string line; std::getline(f, line);)
    if (line.starts_with("{\"autoconfig_link\"")) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) break;
      cal.link_latency_s = j["autoconfig_link"]["latency_s"].get<double>();
      cal.link_bytes_per_s = j["autoconfig_link"]["bytes_per_s"].get<double>();
      return;
    }
  NK_WARN(
      "autoconfig: the link probe (mpirun -np 2 nekton autoconfig --probe-link) failed ({}); "
      "assuming {:.2f} GB/s and {:.0f} us per message (--link-gbps sets the bandwidth):\n{}",
      r.describe(), cal.link_bytes_per_s / 1e9, cal.link_latency_s * 1e6, file_tail(log, 8));
}

void AutoconfigRuns::calibrate_ring(const TrainConfig& cfg, MachineRates& rates,
                                    StepCalibration& cal) {
  const int64_t P = cal.procs_per_node % 2 == 0 ? cal.procs_per_node : 2, dp = P / 2;
  // Two runs at cp 2 x dp P/2, p2p: one micro-batch per rank (the fewest
  // messages: its time past the model is mostly the ring's blocks), then
  // one sequence per micro-batch (the same tiles, the most messages).
  const int64_t G = cfg.global_batch;
  std::vector<int64_t> mbs = {G % dp == 0 ? G / dp : 1};
  if (mbs[0] != 1) mbs.push_back(1);
  ring_probes_.clear();
  // The step predicted at scales 1 and 2 with the ring's messages free, for
  // each probe: what the measured step adds is fitted to both (fit_ring).
  struct Planned {
    int64_t mb;
    StepPrediction p1, p2;
  };
  std::vector<Planned> plan;
  for (const int64_t mb : mbs) {
    const TrainConfig c = probe_config(cfg, 1, 2, int(dp), mb);
    StepCalibration at1 = cal, at2 = cal;
    at1.procs_per_node = at2.procs_per_node = P;
    at1.ring_attention_scale = 1, at2.ring_attention_scale = 2;
    at1.ring_message_s = at2.ring_message_s = 0;
    Planned k{mb, {}, {}};
    try {
      const TrainEstimate e = probe_estimate(c, P, rates);
      k.p1 = predict_step(c, e, at1);
      k.p2 = predict_step(c, e, at2);
    } catch (const Error& e) {
      NK_WARN(
          "autoconfig: no context-parallel probe at micro-batch {} for this recipe ({}); ring "
          "attention costed {}",
          mb, e.what(), plan.empty() ? "as the causal kernel's tiles" : "from the first");
      break;
    }
    if (!(k.p2.total() > k.p1.total())) {
      NK_WARN("autoconfig: no ring attention in the context-parallel probe at micro-batch {}", mb);
      break;
    }
    plan.push_back(k);
  }
  // Two rounds, the second in reverse order, each probe's steps pooled over
  // both: one run on 4 ranks sharing 2 cores can read 30 % slow throughout
  // (where its ranks were placed), and the scale, fitted from the ring's
  // small share of the step, amplifies that (one round each, four 4-rank
  // grids in a row on the Zen 5 VM: scales 4.3, 4.5, 4.9 and 8.6).
  std::vector<std::vector<double>> pooled(plan.size());
  size_t ran = plan.size();  // the probes fitted: those before a failed first run
  for (int round = 1; round <= 2 && ran > 0; ++round)
    for (size_t i = 0; i < ran; ++i) {
      const size_t k = round == 1 ? i : ran - 1 - i;
      const int64_t mb = plan[k].mb;
      const MeasuredRun r =
          run(fmt::format("probe-cp2-mb{}{}", mb, round > 1 ? "-2" : ""), P,
              probe_overrides(1, 2, int(dp), mb, cal.threads), kProbeSteps, plan[k].p2.total());
      if (r.ok()) {
        pooled[k].insert(pooled[k].end(), r.steps_s.begin() + 1, r.steps_s.end());
        continue;
      }
      if (round == 1) {
        NK_WARN(
            "autoconfig: the context-parallel probe at micro-batch {} failed ({}, {}); ring "
            "attention costed {}",
            mb, r.result.describe(), r.log,
            k == 0 ? "as the causal kernel's tiles" : "from the first");
        ran = k;
      } else {
        NK_WARN(
            "autoconfig: the context-parallel probe at micro-batch {} failed in the second "
            "round ({}, {}); fitted on the first",
            mb, r.result.describe(), r.log);
      }
      break;
    }
  for (size_t k = 0; k < ran; ++k) {
    const Planned& q = plan[k];
    const double m = median(pooled[k]);
    ring_probes_.push_back(
        {q.mb, q.p1.total(), m,
         RingProbe{m - q.p1.total(), q.p2.total() - q.p1.total(), q.p1.ring_messages}});
  }
  if (ring_probes_.empty()) return;
  if (!fit_ring(cal, ring_probes_[0].fit,
                ring_probes_.size() > 1 ? &ring_probes_[1].fit : nullptr) &&
      ring_probes_.size() > 1)
    NK_WARN(
        "autoconfig: the two context-parallel probes ({:.1f} and {:.1f} ms past the model) give "
        "no ring scale in [0.5, 10] with a positive cost per message (noise); the scale from the "
        "first, {:.0f} us per message",
        ring_probes_[0].fit.extra_s * 1e3, ring_probes_[1].fit.extra_s * 1e3,
        cal.link_latency_s * 1e6);
}

MeasuredRun AutoconfigRuns::measure(const LayoutCandidate& k, int64_t world, int64_t steps) {
  return run(fmt::format("run{}", ++runs_), world, k.overrides, steps, k.step_s());
}

void AutoconfigRuns::write_recipe(const std::string& path, const LayoutCandidate& k) const {
  std::vector<std::string> o = overrides_;
  o.insert(o.end(), k.overrides.begin(), k.overrides.end());
  const Config c = Config::load(train_schema(), recipe_, o);
  write_file_atomic(
      path, fmt::format("# nekton autoconfig: {}\n# nekton train --nproc {} --config {}\n{}",
                        fmt::join(k.overrides, " "), k.tp * k.pp * k.cp * k.dp, path, c.to_yaml()));
}

int probe_link_main() {
  dist::MpiRuntime mpi;
  const dist::Mesh mesh(mpi.world_size(), mpi.rank(), dist::MeshSpec{});
  dist::ProcessGroups groups = mpi.make_groups(mesh, 60);
  dist::Communicator& world = groups.get("world");
  // The best of 3 rounds of `iters` all-reduces: seconds per call.
  auto time = [&](int64_t bytes, int iters) {
    Tensor x = Tensor::zeros({bytes / 4}, DType::F32);
    world.all_reduce(x);
    double best = 1e30;
    for (int round = 0; round < 3; ++round) {
      world.all_reduce(x);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) world.all_reduce(x);
      best = std::min(
          best,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
    }
    return best;
  };
  const double small = time(4096, 200), big = time(int64_t(4) << 20, 10);
  const double p = double(mpi.world_size());
  const double bw = 2.0 * (p - 1) / p * double(int64_t(4) << 20) / std::max(1e-9, big - small);
  if (mpi.rank() == 0)
    fmt::print(
        "{}\n",
        nlohmann::json{{"autoconfig_link", {{"latency_s", small}, {"bytes_per_s", bw}}}}.dump());
  return 0;
}

}  // namespace nk
