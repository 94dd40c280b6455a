// `nekton autoconfig`: the layouts of a recipe on N nodes of P processes
// (tp, cp, pp, vp, dp, sp, ZeRO sharding, micro-batch, recompute) that fit
// the memory per rank, ranked by a step time calibrated on this machine
// (train/step_calibration.h); --measure runs the best K for a few steps and
// reports measured against predicted; --out writes the chosen one as a
// recipe for `nekton train`.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "apps/arg_parser.h"
#include "apps/autoconfig_runs.h"
#include "apps/commands.h"
#include "apps/host_load.h"
#include "core/atomic_file.h"
#include "core/log.h"
#include "data/dataset/text_dataset.h"
#include "train/layout_search.h"

namespace nk {

namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: nekton autoconfig [--config RECIPE.yaml | RECIPE.yaml] [key=value ...]\n"
    "                         --nodes N --procs-per-node P [--memory GIB] [--measure K]\n"
    "                         [--spread] [--steps S] [--rounds R] [--timeout SEC]\n"
    "                         [--link-gbps G] [--calibration PREVIOUS.json] [--top T]\n"
    "                         [--out FILE.yaml] [--json]\n\n"
    "Searches the layouts of the `nekton train` recipe on N x P processes: parallel.tp, cp\n"
    "(with parallel.cp_comm_type at cp > 1, unless the recipe or a setting fixes it), pp, vp,\n"
    "dp, sp, parallel.shard (ZeRO), train.micro_batch and train.recompute; keeps\n"
    "those nekton train accepts that fit --memory per rank, and ranks them by a predicted\n"
    "step time calibrated on this machine: short probe runs of the recipe on one process\n"
    "(compute rate, per-micro-batch and per-step cost at the threads a rank gets), the same\n"
    "run by P processes at once (the ranks sharing the cores), and the link (an all-reduce\n"
    "probe, then a tensor- and a data-parallel run of the recipe on this host's ranks for\n"
    "the cost per message and per byte inside a step; or --link-gbps; two context-parallel\n"
    "runs for ring attention's blocks and messages). Every timed run counts\n"
    "its median step after the first; the other work on the host meanwhile is reported.\n"
    "--measure K runs the best K (--spread: K spread from the best to the worst) on this\n"
    "host (mpirun) for --steps steps each (killing any past --timeout, by default 180 s\n"
    "plus three times its predicted steps), in --rounds rounds\n"
    "(the order reversed every other round; each layout's step the median of all its\n"
    "rounds' timed steps), and prints measured against predicted; --out writes the chosen\n"
    "layout (the measured best, else the predicted best) as a recipe:\n"
    "nekton train --nproc N*P --config FILE.yaml\n"
    "--calibration takes the rates and the calibration from a previous --json output for\n"
    "the same recipe and processes per node and runs no probe (search again with another\n"
    "--memory or --nodes, or measure other candidates, without calibrating again).\n";

struct AutoconfigArgs {
  std::string config;
  std::vector<std::string> overrides;
  int64_t nodes = 0, procs_per_node = 0, measure = 0, steps = 6, rounds = 3, top = 10;
  double memory_gib = 0, link_gbps = 0, timeout_s = 180;
  std::string out, calibration;
  bool json = false, spread = false;
  bool timeout_given = false;  // --timeout: each run's deadline, fixed
};

AutoconfigArgs parse_autoconfig_args(const std::vector<std::string>& raw) {
  CommandLine cl("autoconfig", raw, 0);
  AutoconfigArgs a;
  cl.bind("--config", a.config, "the training recipe (YAML)");
  cl.bind("--nodes", a.nodes, "hosts (>= 1)");
  cl.bind("--procs-per-node", a.procs_per_node, "processes (ranks) per host (>= 1)");
  cl.bind("--memory", a.memory_gib,
          "GiB per rank a layout may use (default: this host's memory / procs per node)");
  cl.bind("--measure", a.measure, "run the best K candidates on this host and time them");
  cl.bind("--steps", a.steps, "training steps of each measured run (the first is not timed)");
  cl.bind("--rounds", a.rounds,
          "rounds of the measured runs (A B C, C B A, ...), their timed steps pooled");
  cl.bind("--timeout", a.timeout_s,
          "seconds a probe or measured run may take before it is killed (default: 180 plus "
          "three times its predicted steps)");
  cl.bind("--link-gbps", a.link_gbps,
          "link bandwidth in Gbit/s (default: measured by a two-rank all-reduce probe)");
  cl.bind("--calibration", a.calibration,
          "the rates and calibration of a previous --json output (no probes run)");
  cl.bind("--top", a.top, "candidates printed");
  cl.bind("--out", a.out, "write the chosen layout as a recipe for nekton train");
  cl.bind("--spread", a.spread,
          "measure K candidates spread over the ranking, best to worst, instead of the best K");
  cl.bind("--json", a.json, "the search (and measurements) as JSON on stdout");
  a.timeout_given = cl.has("--timeout");
  if (cl.help()) {
    fmt::print("{}\nThe settings are `nekton train`'s (nekton train --help).\n",
               cl.help_text(kUsage));
    std::exit(0);
  }
  for (const std::string& p : cl.finish()) {
    if (p.find('=') != std::string::npos) {
      a.overrides.push_back(p);
    } else if (p.ends_with(".yaml") || p.ends_with(".yml")) {
      if (!a.config.empty()) fail("autoconfig: two recipes given ('{}' and '{}')", a.config, p);
      a.config = p;
    } else {
      fail("autoconfig: '{}' is neither a recipe (FILE.yaml) nor a key=value setting", p);
    }
  }
  if (a.nodes < 1) fail("autoconfig: --nodes must be at least 1, got {} (hosts)", a.nodes);
  if (a.procs_per_node < 1)
    fail("autoconfig: --procs-per-node must be at least 1, got {} (ranks per host)",
         a.procs_per_node);
  if (a.nodes * a.procs_per_node > 4096)
    fail("autoconfig: --nodes x --procs-per-node = {} is over 4096 processes",
         a.nodes * a.procs_per_node);
  if (a.measure < 0) fail("autoconfig: --measure must be at least 0, got {}", a.measure);
  if (a.measure > 0 && a.nodes != 1)
    fail("autoconfig: --measure runs the candidates on this host: use --nodes 1 (got {})", a.nodes);
  if (a.steps < 2)
    fail("autoconfig: --steps must be at least 2 (the first is not timed), got {}", a.steps);
  if (a.rounds < 1) fail("autoconfig: --rounds must be at least 1, got {}", a.rounds);
  if (a.memory_gib < 0) fail("autoconfig: --memory must be positive, got {}", a.memory_gib);
  if (a.link_gbps < 0) fail("autoconfig: --link-gbps must be positive, got {}", a.link_gbps);
  if (!(a.timeout_s > 0)) fail("autoconfig: --timeout must be positive, got {}", a.timeout_s);
  if (a.top < 1) fail("autoconfig: --top must be at least 1, got {}", a.top);
  return a;
}

double mem_total_bytes() {
  std::ifstream f("/proc/meminfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("MemTotal:", 0) == 0) return std::stod(line.substr(9)) * 1024.0;
  return 0;
}

// What a calibration holds for (--calibration checks it): the recipe's
// shapes, batch, dtype and device, and the machine and threads the rates
// were measured on.
std::string calibrated_for(const TrainConfig& c, const std::string& machine) {
  const ModelConfig& m = c.model;
  return fmt::format(
      "{}: {} layers, d_model {}, {}/{} heads, d_ff {}, {} experts, vocab {}; batch {} x {}; {} "
      "on {}; {}",
      m.arch, m.n_layer, m.d_model, m.n_head, m.n_kv_head, m.d_ff, m.num_experts, m.vocab_size,
      c.global_batch, c.seq_len, dtype_name(c.dtype), device_name(c.device), machine);
}

// A previous --json output's rates and calibration, checked against this
// search (the same recipe, machine and processes per node); nk::Error naming
// the file and what differs. Without "calibrated_for" or "rates" (a file
// from before they were written) it cannot check the recipe, says so, and
// the rates are measured again.
struct SavedCalibration {
  nlohmann::json file;
  StepCalibration cal;
};

SavedCalibration load_calibration(const std::string& path, const TrainConfig& cfg,
                                  const StepCalibration& here, MachineRates& rates) {
  SavedCalibration s;
  if (!fs::is_regular_file(path)) fail("autoconfig: --calibration {}: no such file", path);
  s.file = parse_json_object(read_text_file(path), path);
  if (!s.file.contains("calibration"))
    fail("autoconfig: --calibration {}: no \"calibration\" object (not autoconfig --json output)",
         path);
  s.cal = StepCalibration::from_json(s.file.at("calibration"), path);
  if (s.cal.procs_per_node != here.procs_per_node || s.cal.threads != here.threads)
    fail(
        "autoconfig: --calibration {}: calibrated for {} processes per node of {} threads, this "
        "search has {} of {} (run without --calibration to calibrate for it)",
        path, s.cal.procs_per_node, s.cal.threads, here.procs_per_node, here.threads);
  s.cal.cores = here.cores;
  if (s.file.contains("rates")) {
    MachineRates saved = MachineRates::from_json(s.file.at("rates"), path + ": rates");
    if (saved.machine != rates.machine)
      fail("autoconfig: --calibration {}: its rates are {}'s, this host is {}", path, saved.machine,
           rates.machine);
    rates = std::move(saved);
  } else {
    NK_WARN("autoconfig: --calibration {} holds no rates: measured again", path);
  }
  const std::string want = calibrated_for(cfg, rates.machine);
  if (!s.file.contains("calibrated_for"))
    NK_WARN("autoconfig: --calibration {} does not say what it was calibrated for: taken as {}",
            path, want);
  else if (const nlohmann::json& f = s.file.at("calibrated_for"); !f.is_string() || f != want)
    fail(
        "autoconfig: --calibration {}: calibrated for {}, this search is {} (run without "
        "--calibration to calibrate for it)",
        path, f.dump(), want);
  return s;
}

std::string autoconfig_mib(double b) {
  return fmt::format("{:.1f} MiB", b / 1048576.0);
}

}  // namespace

int cmd_autoconfig(const CommandArgs& raw) {
  if (std::find(raw.args.begin(), raw.args.end(), "--probe-link") != raw.args.end())
    return probe_link_main();
  const AutoconfigArgs a = parse_autoconfig_args(raw.args);
  const Config c = Config::load(train_schema(), a.config, a.overrides);
  TrainConfig cfg = train_config_from(c, false);
  const int64_t world = a.nodes * a.procs_per_node;
  StepCalibration cal;
  cal.cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  cal.procs_per_node = a.procs_per_node;
  // A rank's threads, as `nekton train` sizes them (apps/run_ranks.cc).
  cal.threads = cfg.threads > 0 ? cfg.threads : std::max<int64_t>(1, cal.cores / a.procs_per_node);
  cfg.threads = cal.threads;  // the rates are measured at them
  if (!a.json) set_log_level(LogLevel::Warn);

  AutoconfigRuns runs(a.config, a.overrides, cfg, a.timeout_s, !a.timeout_given);
  const HostCpuSample host_start = sample_host_cpu();
  const std::string load_start = load_averages();
  const double budget =
      a.memory_gib > 0 ? a.memory_gib * 1073741824.0 : mem_total_bytes() / double(a.procs_per_node);

  MachineRates rates;
  rates.machine = rates_machine(cfg);
  // A previous search's calibration (--calibration: no probe runs), or
  // this one's.
  Calibration probe;
  SavedCalibration saved;
  if (!a.calibration.empty()) {
    saved = load_calibration(a.calibration, cfg, cal, rates);
    cal = saved.cal;
  }
  measure_missing_rates(cfg, rates);
  if (a.link_gbps > 0) cal.link_bytes_per_s = a.link_gbps * 1e9 / 8.0;
  if (a.calibration.empty()) {
    // The ranks' share of the cores (measured only for this host's layout
    // when --measure will run it; else from the core count), then the
    // compute probes: the recipe on one process.
    probe = runs.calibrate_compute(cfg, rates, cal, world);
    if (a.nodes == 1 && a.procs_per_node > 1) {
      // The recipe's own probe run by as many processes at once as the
      // host has ranks; a CPU loop if that failed.
      cal.sharing = runs.measure_sharing(a.procs_per_node);
      if (cal.sharing <= 0)
        cal.sharing = measure_core_sharing(cal.threads, cal.threads * a.procs_per_node);
    }
    cal.refault_s_per_byte = cal.page_refault_s_per_byte = measure_page_refault().s_per_byte;
    if (a.link_gbps <= 0 && world > 1) runs.calibrate_link(cal);
    if (world > 1 && a.nodes == 1) {
      runs.calibrate_messages(cfg, rates, cal);
      runs.calibrate_ring(cfg, rates, cal);
      runs.calibrate_fsdp(cfg, rates, cal);
      runs.calibrate_zero2(cfg, rates, cal);
    }
  }

  LayoutSearchOptions opt;
  opt.world = world;
  opt.budget_bytes = budget;
  opt.rates = &rates;
  opt.search_cp = opt.search_vp = opt.search_pp_layout = true;
  // A type (or a2a+p2p's sizes) the user set stays as set, as the keys the
  // search does not cover do.
  const bool comm_fixed =
      c.given("parallel.cp_comm_type") || c.given("parallel.hierarchical_context_parallel_sizes");
  opt.search_cp_comm = !comm_fixed;
  opt.calibration = &cal;
  const std::vector<LayoutCandidate> all = search_layouts(cfg, opt);
  std::vector<const LayoutCandidate*> ok;
  for (const LayoutCandidate& k : all)
    if (k.accepted) ok.push_back(&k);
  if (ok.empty()) {
    std::string why;
    int64_t smallest = 0;
    for (const LayoutCandidate& k : all)
      if (k.memory_bytes > 0 && (smallest == 0 || k.memory_bytes < smallest))
        smallest = k.memory_bytes;
    for (size_t i = 0; i < all.size() && i < 5; ++i) why += "\n  " + all[i].reason;
    fail(
        "autoconfig: no layout of {} processes fits {} per rank (--memory{}){}; the first "
        "rejections:{}",
        world, autoconfig_mib(budget),
        a.memory_gib > 0 ? "" : ": this host's memory / --procs-per-node",
        smallest > 0 ? fmt::format("; the smallest needs {}", autoconfig_mib(double(smallest)))
                     : "",
        why);
  }

  // The candidates to run: the best K, or with --spread K spread evenly
  // over the ranking from the best to the worst (a grid that tests the
  // ranking, not only its head).
  std::vector<size_t> pick;
  const size_t K = std::min(ok.size(), size_t(a.measure));
  for (size_t j = 0; j < K; ++j) {
    const size_t i = a.spread && K > 1 ? (j * (ok.size() - 1) + (K - 1) / 2) / (K - 1) : j;
    if (pick.empty() || pick.back() != i) pick.push_back(i);
  }
  // In rounds, every other one in reverse order, so that a slow spell of
  // the host falls on several layouts' runs, not all of one layout's; a
  // layout that failed is not run again.
  std::map<size_t, std::vector<MeasuredRun>> rounds;
  const HostCpuSample measure_start = sample_host_cpu();
  for (int64_t r = 0; r < a.rounds; ++r)
    for (size_t n = 0; n < pick.size(); ++n) {
      const size_t i = pick[r % 2 ? pick.size() - 1 - n : n];
      std::vector<MeasuredRun>& done = rounds[i];
      if (!done.empty() && !done.back().ok()) continue;
      if (!a.json)
        fmt::print(stderr, "measuring{} {}/{}: #{} {}\n",
                   a.rounds > 1 ? fmt::format(" (round {}/{})", r + 1, a.rounds) : "", n + 1,
                   pick.size(), i + 1, ok[i]->name());
      done.push_back(runs.measure(*ok[i], world, a.steps));
    }
  std::map<size_t, MeasuredRun> measured;
  for (const auto& [i, done] : rounds) measured[i] = pool_rounds(done);
  // Other work on the host: the share of the cores it took while the
  // probes and the measured runs ran, and the load averages; after
  // measuring, how the host's speed moved since the calibration.
  const double drift = measured.empty() ? 0.0 : runs.measure_drift();
  const HostCpuSample host_end = sample_host_cpu();
  const nlohmann::json host = {{"cores", host_end.cores},
                               {"load_averages_start", load_start},
                               {"load_averages_end", load_averages()},
                               {"others_cpu_share", others_cpu_share(host_start, host_end)},
                               {"others_cpu_share_measuring",
                                measured.empty() ? 0.0 : others_cpu_share(measure_start, host_end)},
                               {"probe_drift", drift}};
  // The chosen layout: the measured best, else the predicted best.
  size_t chosen = 0;
  double best = 0;
  for (const auto& [i, m] : measured)
    if (m.ok() && (best == 0 || m.step_s < best)) best = m.step_s, chosen = i;
  if (!a.out.empty() && (measured.empty() || best > 0)) runs.write_recipe(a.out, *ok[chosen]);

  // How the calibration was fitted: by this search's probes or the file's.
  const bool ring_probed = !runs.ring_probes().empty() || (saved.file.contains("ring_probes") &&
                                                           !saved.file.at("ring_probes").empty());
  const std::string fsdp_fit =
      saved.file.contains("fsdp_fit") && saved.file.at("fsdp_fit").is_string()
          ? saved.file.at("fsdp_fit").get<std::string>()
          : runs.fsdp_fit();
  if (a.json) {
    nlohmann::json j = {{"world", world},
                        {"nodes", a.nodes},
                        {"procs_per_node", a.procs_per_node},
                        {"budget_bytes", budget},
                        {"calibration", cal.to_json()},
                        {"recipe", {{"config", a.config}, {"overrides", a.overrides}}},
                        {"calibrated_for", calibrated_for(cfg, rates.machine)},
                        {"rates", rates.to_json()},
                        {"host_load", host},
                        {"probes", probe.to_json()},
                        {"message_probes", nlohmann::json::array()},
                        {"ring_probes", nlohmann::json::array()},
                        {"accepted", ok.size()},
                        {"cp_comm_searched", !comm_fixed},
                        {"candidates", nlohmann::json::array()},
                        {"chosen", chosen}};
    for (const auto* m : {&runs.message_probe(), &runs.bytes_probe()})
      if (m->measured_s > 0)
        j["message_probes"].push_back({{"messages", m->messages},
                                       {"bytes", m->bytes},
                                       {"predicted_without_s", m->predicted_s},
                                       {"measured_s", m->measured_s}});
    for (const auto& [key, z] : {std::pair{"zero2_probe", &runs.zero2_probe()},
                                 std::pair{"zero2_pair_probe", &runs.zero2_pair_probe()}})
      if (z->measured_s > 0)
        j[key] = {{"micro_batches", z->micro_batches},
                  {"predicted_without_s", z->predicted_s},
                  {"measured_s", z->measured_s}};
    j["fsdp_fit"] = runs.fsdp_fit();
    j["fsdp_pair_fit"] = runs.fsdp_pair_fit();
    j["fsdp_probes"] = nlohmann::json::array();
    for (const AutoconfigRuns::FsdpProbe& f : runs.fsdp_probes())
      j["fsdp_probes"].push_back({{"tp", f.tp},
                                  {"micro_batch", f.micro_batch},
                                  {"global_batch", f.global_batch},
                                  {"predicted_without_s", f.predicted_s},
                                  {"per_s_per_byte", f.per_s_per_byte},
                                  {"per_step_s", f.per_step_s},
                                  {"measured_s", f.measured_s},
                                  {"fitted_s", f.fitted_s}});
    for (const AutoconfigRuns::CpProbe& r : runs.ring_probes())
      j["ring_probes"].push_back({{"micro_batch", r.micro_batch},
                                  {"predicted_without_s", r.predicted_s},
                                  {"measured_s", r.measured_s},
                                  {"ring_messages", r.fit.ring_messages},
                                  {"per_scale_s", r.fit.per_scale_s}});
    for (size_t i = 0; i < ok.size(); ++i) {
      nlohmann::json k = ok[i]->to_json();
      k["rank"] = i + 1;
      k["layout"] = ok[i]->name();
      if (measured.count(i)) k["measured"] = measured.at(i).to_json(ok[i]->step_s());
      j["candidates"].push_back(k);
    }
    if (!a.calibration.empty()) {
      // The probes that calibrated it, as the file has them.
      j["calibration_from"] = a.calibration;
      for (const char* key : {"probes", "message_probes", "ring_probes", "zero2_probe",
                              "zero2_pair_probe", "fsdp_fit", "fsdp_pair_fit", "fsdp_probes"}) {
        if (saved.file.contains(key))
          j[key] = saved.file.at(key);
        else
          j.erase(key);
      }
    }
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print(
        "{} layouts of {} processes ({} node{} x {}) for {} ({} layers, d_model {}), global batch "
        "{} x {} tokens; {} fit {} per rank\n",
        all.size(), world, a.nodes, a.nodes == 1 ? "" : "s", a.procs_per_node, cfg.model.arch,
        cfg.model.n_layer, cfg.model.d_model, cfg.global_batch, cfg.seq_len, ok.size(),
        autoconfig_mib(budget));
    if (comm_fixed)
      fmt::print("parallel.cp_comm_type = {}{}: as given, not searched\n",
                 cfg.parallel.cp_comm_type,
                 cfg.parallel.hierarchical_cp_sizes.empty()
                     ? ""
                     : fmt::format(" ({})", fmt::join(cfg.parallel.hierarchical_cp_sizes, "x")));
    fmt::print(
        "host: other work took {:.0f} % of the {} cores meanwhile{}; load averages {} at the "
        "start, {} at the end{}\n",
        100.0 * host["others_cpu_share"].get<double>(), host_end.cores,
        measured.empty() ? ""
                         : fmt::format(" ({:.0f} % while measuring)",
                                       100.0 * host["others_cpu_share_measuring"].get<double>()),
        load_start, host["load_averages_end"].get<std::string>(),
        drift > 0 ? fmt::format("; the one-process probe ran {:+.0f} % after measuring against "
                                "the calibration (every prediction moves with it)",
                                100.0 * (drift - 1.0))
                  : "");
    fmt::print(
        "calibration: {} cores, {} thread{} per rank (cores shared x{:.2f}{}); compute x{:.2f} of "
        "the GEMM/attention rates + {:.2f} ms per micro-batch + {:.2f} ms per step (probes: {}); "
        "link {:.2f} GB/s, "
        "{:.0f} us per message ({}){}{}; FSDP {:.2f} ns a gathered byte + {:.1f} ms a step{} "
        "(fit: {}; the page probe {:.2f} ns a byte){}\n\n",
        cal.cores, cal.threads, cal.threads == 1 ? "" : "s", cal.oversubscription(),
        cal.sharing > 0 ? ", measured" : ", from the core count", cal.compute_scale,
        cal.per_micro_batch_s * 1e3, cal.per_step_s * 1e3,
        a.calibration.empty() ? probe.summary() : "taken from " + a.calibration,
        cal.link_bytes_per_s / 1e9, cal.link_latency_s * 1e6,
        a.link_gbps > 0          ? "--link-gbps"
        : !a.calibration.empty() ? "from " + a.calibration
        : world > 1              ? "measured"
                                 : "unused",
        !ring_probed
            ? ""
            : fmt::format("; ring attention x{:.2f} of the causal kernel's tiles, {:.0f} us per "
                          "ring message{}",
                          cal.ring_attention_scale,
                          (cal.ring_message_s >= 0 ? cal.ring_message_s : cal.link_latency_s) * 1e6,
                          cal.ring_message_s >= 0 ? "" : " (the link's)"),
        cal.message_wait_share > 0 ? fmt::format("; messages' waits at most {:.0f} % of the step",
                                                 100.0 * cal.message_wait_share)
                                   : "",
        cal.refault_s_per_byte * 1e9, cal.fsdp_step_s * 1e3,
        cal.fsdp_pair_step_s >= 0
            ? fmt::format(" in groups of {}, {:.2f} ns + {:.1f} ms in groups of 2", cal.fsdp_group,
                          cal.refault_in(2) * 1e9, cal.fsdp_pair_step_s * 1e3)
            : "",
        fsdp_fit, cal.page_refault_s_per_byte * 1e9,
        cal.zero2_group > 1
            ? fmt::format("; ZeRO-2 {:.1f} ms a micro-batch's reduction past its bytes{}",
                          cal.zero2_micro_batch_s * 1e3 * cal.oversubscription(),
                          cal.zero2_pair_micro_batch_s >= 0
                              ? fmt::format(" ({:.1f} in groups of 2)",
                                            cal.zero2_in(2) * 1e3 * cal.oversubscription())
                              : "")
            : "");
    const bool meas = !measured.empty();
    fmt::print("{:>3}  {:<50} {:>12} {:>10} {:>10}{}\n", "#", "layout", "memory/rank", "pred ms",
               "tokens/s", meas ? " median step ms    error" : "");
    for (size_t i = 0; i < ok.size(); ++i) {
      if (i >= size_t(a.top) && !measured.count(i)) continue;
      std::string m;
      if (measured.count(i)) {
        const MeasuredRun& r = measured.at(i);
        m = r.ok() ? fmt::format(" {:>14.1f} {:>+7.1f}%", r.step_s * 1e3,
                                 100.0 * (ok[i]->step_s() - r.step_s) / r.step_s)
                   : "  " + r.result.describe();
      }
      fmt::print("{:>3}  {:<50} {:>12} {:>10.1f} {:>10.0f}{}\n", i + 1, ok[i]->name(),
                 autoconfig_mib(double(ok[i]->memory_bytes)), ok[i]->step_s() * 1e3,
                 ok[i]->tokens_per_s, m);
    }
    for (const auto& [i, r] : measured)
      if (!r.ok())
        fmt::print("\n#{} failed ({}); the end of its log {}:\n{}", i + 1, r.result.describe(),
                   r.log, r.log_tail);
    if (meas && best == 0) {
      fmt::print("\nno measured run finished\n");
      fail("autoconfig: none of the {} measured runs finished (their logs are named above)",
           measured.size());
    }
    fmt::print("\n{} best: #{} {}\n", meas ? "measured" : "predicted", chosen + 1,
               ok[chosen]->name());
    fmt::print("  nekton train --nproc {}{}{}{} {}\n", world,
               a.config.empty() ? "" : " --config " + a.config, a.overrides.empty() ? "" : " ",
               fmt::join(a.overrides, " "), fmt::join(ok[chosen]->overrides, " "));
    if (!a.out.empty())
      fmt::print("  written to {}: nekton train --nproc {} --config {}\n", a.out, world, a.out);
  }
  if (!measured.empty() && best == 0)
    fail("autoconfig: none of the {} measured runs finished (their logs are named above)",
         measured.size());
  return 0;
}

}  // namespace nk
