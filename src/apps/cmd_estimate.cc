// `nekton estimate`: memory per rank, FLOPs and step time of a training
// recipe before it runs (train/estimate.h); --measure runs two steps and
// prints what they used beside each figure; --budget answers what fits.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include <yaml-cpp/yaml.h>

#include "align/align_config.h"
#include "apps/commands.h"
#include "ckpt/hf_io.h"
#include "core/allocator.h"
#include "core/atomic_file.h"
#include "core/log.h"
#include "data/dataset/text_dataset.h"
#include "train/estimate.h"
#include "train/layout_search.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace nk {

namespace fs = std::filesystem;

namespace {

constexpr const char* kEstimateUsage =
    "usage: nekton estimate [--config RECIPE.yaml] [key=value ...] [--nproc N] [--json]\n"
    "                       [--measure] [--budget GIB] [--rates FILE | --no-time]\n"
    "       nekton estimate --search --nproc N [--budget GIB] [--link-gbps G] [--json] ...\n\n"
    "Memory per rank (weights, gradients, optimizer state, activations, workspaces), FLOPs\n"
    "per step and predicted step time of the `nekton train` recipe the settings give; of an\n"
    "align recipe (align.* keys), also the memory of each reference model choice.\n"
    "  --nproc N    processes (default: parallel.tp x parallel.pp x parallel.dp)\n"
    "  --json       the estimate as JSON on stdout\n"
    "  --measure    also run two training steps (one process) and print what they used\n"
    "  --budget G   what fits in G GiB per rank: the largest micro-batch for each\n"
    "               train.recompute policy, and the cheapest policy at this micro-batch\n"
    "  --rates F    this machine's GEMM, attention and memory rates (JSON); default: the\n"
    "               cache (NEKTON_CACHE or ~/.cache/nekton/rates.json), measured once\n"
    "  --no-time    no step-time prediction (nothing measured)\n"
    "  --search     the layouts of N processes (tp, pp, dp, ep, sp, parallel.shard, micro-batch,\n"
    "               recompute) that nekton train accepts and that fit --budget, best first:\n"
    "               predicted step time with a communication term (by memory with --no-time)\n"
    "  --link-gbps G  link bandwidth of the communication term, Gbit/s (default 4: two ranks'\n"
    "               shared-memory all-reduce, BENCHMARKS.md)\n";

struct EstimateArgs {
  CommandArgs common;
  int64_t world = 0;
  bool json = false, measure = false, time = true, search = false;
  double budget_gib = 0, link_gbps = kDefaultLinkGbps;
  std::string rates;
};

double number_arg(const std::vector<std::string>& args, size_t& i, const std::string& flag) {
  if (i + 1 >= args.size()) fail("{} needs a value", flag);
  const std::string& v = args[++i];
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(x > 0)) fail("{} needs a positive number, got '{}'", flag, v);
  return x;
}

EstimateArgs parse(const std::vector<std::string>& args) {
  EstimateArgs e;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& s = args[i];
    if (s == "--json") {
      e.json = true;
    } else if (s == "--measure") {
      e.measure = true;
    } else if (s == "--search") {
      e.search = true;
    } else if (s == "--link-gbps") {
      e.link_gbps = number_arg(args, i, s);
    } else if (s == "--no-time") {
      e.time = false;
    } else if (s == "--budget") {
      e.budget_gib = number_arg(args, i, s);
    } else if (s == "--nproc") {
      const double n = number_arg(args, i, s);
      if (n != double(int64_t(n)) || n > (1 << 20)) fail("--nproc needs a process count >= 1");
      e.world = int64_t(n);
    } else if (s == "--rates") {
      if (i + 1 >= args.size()) fail("--rates needs a file name");
      e.rates = args[++i];
    } else {
      rest.push_back(s);
    }
  }
  e.common = parse_command_args(rest);
  if (!e.rates.empty() && !e.time) fail("--rates and --no-time exclude each other");
  if (e.search && e.world == 0) fail("--search needs the world size: --nproc N");
  if (e.search && e.measure) fail("--search and --measure exclude each other");
  return e;
}

std::string mib(double bytes) {
  return fmt::format("{:.1f} MiB", bytes / 1048576.0);
}

// Whether the settings are an align recipe: the YAML file has an `align`
// section or an override sets an align.* key.
bool is_align_recipe(const CommandArgs& a) {
  for (const std::string& o : a.overrides)
    if (o.starts_with("align.")) return true;
  if (a.config_path.empty()) return false;
  try {
    const YAML::Node n = YAML::LoadFile(a.config_path);
    return n.IsMap() && n["align"].IsDefined();
  } catch (const YAML::Exception&) {
    return false;  // Config::load reported it already
  }
}

// What each choice of align.reference costs a rank beside the policy
// (align/reference.h): precompute, 8 bytes per sequence after one forward
// pass over the data; copy, a frozen copy of the initial model in the
// compute dtype and its forward-only workspace; adapter_off, nothing (a
// forward of the policy with its adapters off per micro-batch).
nlohmann::json align_reference(const TrainConfig& cfg, const AlignConfig& ac,
                               const TrainEstimate& e) {
  nlohmann::json j = {{"method", ac.method}};
  // The method and reference as nekton align resolves them (AlignConfig::
  // check; the data is not read here). rs and steerlm train by SFT.
  AlignConfig r = ac;
  bool needs = false;
  if (ac.method != "rs" && ac.method != "steerlm") {
    if (r.data_path.empty()) r.data_path = "(not read by estimate)";
    r.check(cfg.peft.adapters());
    needs = !r.reward_model && r.loss.needs_reference();
  }
  j["needs_reference"] = needs;
  if (!needs) return j;
  j["reference"] = r.reference_source == ReferenceSource::AdapterOff ? "adapter_off"
                   : r.reference_source == ReferenceSource::Copy     ? "copy"
                                                                     : "precompute";
  const int64_t copy_weights = e.params * int64_t(dtype_size(cfg.dtype));
  const ActivationBytes fwd =
      activation_bytes(cfg.model, cfg.dtype, cfg.micro_batch, cfg.seq_len, {}, 1, false, {}, false);
  j["precompute"] = {{"bytes_per_sequence", 8}};
  j["copy"] = {{"weight_bytes", copy_weights}, {"activation_bytes", fwd.total()}};
  j["adapter_off"] = {{"bytes", 0}, {"needs_adapters", true}};
  return j;
}

// PPO's critic of its own (align.value_model, align/critic.h): a one-label
// classifier trained beside the policy, whole on every rank: its f32
// weights (and their compute copy in bf16 runs), f32 gradients, AdamW's f32
// moments and one micro-batch's training activations.
nlohmann::json align_critic(const TrainConfig& cfg, const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(path))
    fail("align.value_model: '{}' is not a model folder (no config.json)", dir);
  ModelConfig mc = any_model_folder_config(dir);
  mc.num_labels = 1;
  mc.value_head = false;
  const int64_t n = Transformer::layout_for(mc).count();
  const int64_t copy = cfg.dtype == DType::F32 ? 0 : n * int64_t(dtype_size(cfg.dtype));
  const ActivationBytes act = activation_bytes(mc, cfg.dtype, cfg.micro_batch, cfg.seq_len, {});
  return {{"dir", dir},
          {"params", n},
          {"weight_bytes", 4 * n + copy},
          {"gradient_bytes", 4 * n},
          {"optimizer_bytes", 8 * n},
          {"activation_bytes", act.total()}};
}

// The rate cache's JSON (empty when absent or unreadable) and this
// machine's entry in it.
nlohmann::json read_rate_cache(const std::string& path) {
  if (fs::exists(path)) {
    try {
      return parse_json_object(read_text_file(path), path);
    } catch (const Error& e) {
      NK_WARN("{}; measuring again", e.what());
    }
  }
  return nlohmann::json::object();
}

void write_rate_cache(const std::string& path, nlohmann::json cache, const MachineRates& r) {
  cache[r.machine] = r.to_json();
  fs::create_directories(fs::path(path).parent_path());
  write_file_atomic(path, cache.dump(1) + "\n");
}

// The rates for cfg: --rates FILE as given (nk::Error if it lacks one), else
// the cache's entry for this machine, completed by measuring and saved back.
MachineRates rates_for(const TrainConfig& cfg, const std::string& file) {
  if (!file.empty())
    return MachineRates::from_json(parse_json_object(read_text_file(file), file), file);
  const std::string path = rates_cache_path();
  const nlohmann::json cache = read_rate_cache(path);
  const std::string machine = rates_machine(cfg);
  MachineRates r;
  if (cache.contains(machine)) r = MachineRates::from_json(cache[machine], path + ": " + machine);
  const size_t before = r.gemm.size() + r.attention.size();
  measure_missing_rates(cfg, r);
  if (r.gemm.size() + r.attention.size() != before || !cache.contains(machine))
    write_rate_cache(path, cache, r);
  return r;
}

// --search: every layout of a.world processes (train/layout_search.h); the
// rates the candidates need are measured into the cache (not into --rates
// FILE, which stays as given).
int search(const EstimateArgs& a, const TrainConfig& cfg) {
  std::optional<MachineRates> rates;
  nlohmann::json cache;
  const std::string path = a.rates.empty() ? rates_cache_path() : a.rates;
  size_t before = 0;
  if (a.time) {
    if (!a.rates.empty()) {
      rates = MachineRates::from_json(parse_json_object(read_text_file(a.rates), a.rates), a.rates);
    } else {
      cache = read_rate_cache(path);
      const std::string machine = rates_machine(cfg);
      rates = cache.contains(machine)
                  ? MachineRates::from_json(cache[machine], path + ": " + machine)
                  : MachineRates{};
      rates->machine = machine;
    }
    before = rates->gemm.size() + rates->attention.size();
  }
  LayoutSearchOptions opt;
  opt.world = a.world;
  opt.budget_bytes = a.budget_gib * 1073741824.0;
  opt.link_gbps = a.link_gbps;
  opt.rates = rates ? &*rates : nullptr;
  const std::vector<LayoutCandidate> all = search_layouts(cfg, opt);
  const size_t measured = rates ? rates->gemm.size() + rates->attention.size() - before : 0;
  if (rates && a.rates.empty() && (measured > 0 || !cache.contains(rates->machine)))
    write_rate_cache(path, cache, *rates);
  const auto accepted =
      std::count_if(all.begin(), all.end(), [](const LayoutCandidate& k) { return k.accepted; });
  if (a.json) {
    nlohmann::json j = {{"world", a.world},         {"budget_bytes", opt.budget_bytes},
                        {"link_gbps", a.link_gbps}, {"ranked_by", rates ? "step_time" : "memory"},
                        {"accepted", accepted},     {"candidates", nlohmann::json::array()}};
    for (const LayoutCandidate& k : all) j["candidates"].push_back(k.to_json());
    if (rates) j["rates"] = rates->to_json(), j["rates_measured"] = measured;
    fmt::print("{}\n", j.dump(2));
    return accepted > 0 ? 0 : 1;
  }
  fmt::print(
      "{} layouts of {} processes for {} ({} layers, {} heads / {} kv heads), global batch {} x "
      "{} tokens; {} accepted{}\n",
      all.size(), a.world, cfg.model.arch, cfg.model.n_layer, cfg.model.n_head, cfg.model.n_kv_head,
      cfg.global_batch, cfg.seq_len, accepted,
      a.budget_gib > 0 ? fmt::format(" within {} GiB per rank", a.budget_gib) : "");
  fmt::print("ranked by {}\n\n",
             rates ? fmt::format("predicted step time (compute + communication over {} Gbit/s)",
                                 a.link_gbps)
                   : "memory per rank (--no-time: no step time)");
  if (accepted == 0) {
    fmt::print("nothing fits; the first rejections:\n");
    for (size_t i = 0; i < all.size() && i < 5; ++i) fmt::print("  {}\n", all[i].reason);
    return 1;
  }
  fmt::print("{:>3} {:>3} {:>3} {:>3} {:>3} {:>4} {:>9} {:>5} {:>9} {:>12} {:>10} {:>10} {:>7}\n",
             "#", "tp", "pp", "dp", "ep", "sp", "shard", "mb", "recompute", "memory/rank",
             "step ms", "tokens/s", "bubble");
  int shown = 0;
  for (const LayoutCandidate& k : all) {
    if (!k.accepted || shown == 10) break;
    fmt::print(
        "{:>3} {:>3} {:>3} {:>3} {:>3} {:>4} {:>9} {:>5} {:>9} {:>12} {:>10} {:>10} {:>6.1f}%\n",
        ++shown, k.tp, k.pp, k.dp, k.ep, k.sp ? "yes" : "no", k.shard, k.micro_batch, k.recompute,
        mib(double(k.memory_bytes)), rates ? fmt::format("{:.1f}", k.step_s() * 1000.0) : "-",
        rates ? fmt::format("{:.0f}", k.tokens_per_s) : "-", 100.0 * k.bubble);
  }
  if (rates)
    fmt::print("\nrates of {} ({}{})\n", rates->machine, path,
               measured ? fmt::format("; {} measured now", measured) : "");
  fmt::print("\nbest: nekton train --nproc {} ... {}\n", a.world,
             fmt::join(all.front().overrides, " "));
  fmt::print("{} rejected (--json lists each with its reason)\n", all.size() - size_t(accepted));
  return 0;
}

struct Measured {
  double persistent = 0;   // weights, gradients, optimizer state as allocated
  double activations = 0;  // the step's planned activation workspace (Activations::bytes)
  double peak = 0;         // Nekton tensors' peak over the steps
  double rss = 0;          // the process's peak RSS
  double step_s = 0;       // mean over the steps after the first
};

// Two steps after a warm-up one of the recipe, on one process, in a
// temporary folder.
Measured measure(TrainConfig cfg) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("nekton-estimate-{}", ::getpid());
  struct Remove {
    fs::path d;
    ~Remove() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } remove{dir};
  cfg.out_dir = dir.string();
  cfg.metrics_file = (dir / "metrics.jsonl").string();
  cfg.steps = 3;
  cfg.val_every = 0;
  cfg.save_every = 0;
  cfg.exit_at_step = 0;
  cfg.save_final = false;  // timing only: no checkpoint, no model to write and delete
  cfg.resume = "never";
  cfg.peak_tflops = 1;  // no GEMM-peak probe: its matrices would count in the peak
  cfg.lr.warmup_steps = 0;
  cfg.lr.decay_steps = 0;
  // The run's log goes to stderr: stdout carries the estimate (--json).
  struct StdoutToStderr {
    int saved;
    StdoutToStderr() : saved((std::fflush(stdout), ::dup(1))) { ::dup2(2, 1); }
    ~StdoutToStderr() {
      std::fflush(stdout);
      ::dup2(saved, 1);
      ::close(saved);
    }
  } to_stderr;
  Trainer trainer(cfg);
  Measured m;
  Transformer& model = trainer.model();
  const bool copy = model.compute_params().raw() != model.params().raw();
  m.persistent = double(model.params().nbytes()) +
                 (copy ? double(model.compute_params().nbytes()) : 0.0) +
                 double(model.grad_bytes()) + double(trainer.optimizer().state_bytes());
  Allocator::get(cfg.device).reset_peak();  // the steps' peak, not building the model's
  trainer.run();
  const auto& h = trainer.history();
  for (size_t i = 0; i < h.size(); ++i) {
    m.peak = std::max(m.peak, double(h[i].peak_bytes));
    if (i > 0) m.step_s += h[i].step_ms / 1000.0 / double(h.size() - 1);
  }
  m.activations =
      double(Activations(model, cfg.micro_batch, cfg.seq_len, true,
                         recompute_plan(cfg.recompute, cfg.recompute_layers, cfg.model.n_layer))
                 .bytes());
  m.rss = double(peak_rss_bytes());
  return m;
}

// What fits in `budget` bytes per rank: the largest micro-batch of each
// policy (one micro-batch per step and rank), and the first policy, cheapest
// in compute, that fits the recipe's micro-batch.
nlohmann::json what_fits(const TrainConfig& cfg, int64_t world, double budget) {
  nlohmann::json out = {{"budget_bytes", budget},
                        {"largest_micro_batch", nlohmann::json::object()}};
  std::string cheapest;
  for (const char* policy : {"none", "selective", "full"}) {
    auto total = [&](int64_t mb) {
      TrainConfig c = cfg;
      c.recompute = policy;
      c.micro_batch = mb;
      c.global_batch = mb * (cfg.global_batch / cfg.micro_batch);
      return double(estimate_training(c, world, nullptr).peak().total());
    };
    int64_t lo = 0, hi = 1;
    while (hi <= (1 << 20) && total(hi) <= budget) lo = hi, hi *= 2;
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      (total(mid) <= budget ? lo : hi) = mid;
    }
    out["largest_micro_batch"][policy] = lo;
    if (cheapest.empty() && total(cfg.micro_batch) <= budget) cheapest = policy;
  }
  out["cheapest_recompute"] = cheapest.empty() ? nlohmann::json() : nlohmann::json(cheapest);
  return out;
}

}  // namespace

int cmd_estimate(const CommandArgs& raw) {
  if (std::find(raw.args.begin(), raw.args.end(), "--help") != raw.args.end() ||
      std::find(raw.args.begin(), raw.args.end(), "-h") != raw.args.end()) {
    fmt::print("{}\nThe settings are `nekton train`'s (nekton train --help).\n", kEstimateUsage);
    return 0;
  }
  const EstimateArgs a = parse(raw.args);
  const bool align = is_align_recipe(a.common);
  Config c = Config::load(align ? align_schema() : train_schema(), a.common.config_path,
                          a.common.overrides);
  if (align) set_align_model_keys(c);                   // a reward model's score head
  const TrainConfig cfg = train_config_from(c, false);  // data only for --measure
  AlignConfig ac;
  if (align) {
    ConfigReader r(c);
    ac.bind(r);
  }
  if (a.search) return search(a, cfg);
  std::optional<MachineRates> rates;
  if (a.time) rates = rates_for(cfg, a.rates);
  const TrainEstimate e = estimate_training(cfg, a.world, rates ? &*rates : nullptr);
  std::optional<Measured> m;
  if (a.measure) {
    if (cfg.data.path.empty() && !cfg.data.indexed() && !cfg.data.sft())
      fail("--measure trains two steps: give it data (data.path=TEXT_FILE or data.prefix=...)");
    if (e.world != 1)
      fail("--measure runs one process; this layout has {} (parallel.* and --nproc)", e.world);
    if (!a.json) set_log_level(LogLevel::Warn);
    m = measure(cfg);
  }
  nlohmann::json fits;
  if (a.budget_gib > 0) fits = what_fits(cfg, a.world, a.budget_gib * 1073741824.0);
  const nlohmann::json reference = align ? align_reference(cfg, ac, e) : nlohmann::json();
  const nlohmann::json critic =
      align && ac.method == "ppo" && !c.get_string("align.value_model").empty()
          ? align_critic(cfg, c.get_string("align.value_model"))
          : nlohmann::json();

  if (a.json) {
    nlohmann::json j = estimate_json(e);
    if (rates) j["rates"] = rates->to_json();
    if (m)
      j["measured"] = {{"persistent_bytes", m->persistent},
                       {"activation_workspace_bytes", m->activations},
                       {"peak_tensor_bytes", m->peak},
                       {"peak_rss_bytes", m->rss},
                       {"step_seconds", m->step_s}};
    if (!fits.is_null()) j["fits"] = fits;
    if (align) j["align"] = reference;
    if (!critic.is_null()) j["align"]["critic"] = critic;
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  const ModelConfig& mc = cfg.model;
  const RankEstimate& r = e.peak();
  fmt::print(
      "{} model, {} layers, {:.2f}M parameters; {} compute; micro-batch {} x {} tokens, {} "
      "per step; train.recompute={}{}\n",
      mc.arch, mc.n_layer, double(e.params) / 1e6, dtype_name(cfg.dtype), cfg.micro_batch,
      cfg.seq_len, cfg.grad_accum(), cfg.recompute,
      cfg.recompute_layers ? fmt::format(" (first {} layers)", cfg.recompute_layers) : "");
  fmt::print("world {} (dp {}, tp {}{}, pp {}); the rank that needs the most: stage {}\n\n",
             e.world, e.dp, e.tp, cfg.parallel.sequence_parallel ? " with sp" : "", e.pp, r.stage);
  if (mc.is_moe())
    fmt::print(
        "experts: {:.2f}M parameters; parallel.ep {}: each rank holds and computes {} of the {} "
        "experts of every MoE layer{} ({:.2f}M parameters, with their gradients and optimizer "
        "state: in the figures below); expert all-to-all {} sent per rank per step\n\n",
        double(e.expert_params) / 1e6, e.ep, mc.num_experts / e.ep, mc.num_experts,
        e.tp > 1 && e.etp > 1 && e.etp < e.tp
            ? fmt::format(
                  ", each split over parallel.etp = {} (the tp ranks' {} expert tensor-parallel "
                  "groups split the tokens)",
                  e.etp, e.tp / e.etp)
        : e.tp > 1 && e.etp > 1 ? fmt::format(", each split over parallel.etp = {}", e.etp)
        : e.tp > 1 ? fmt::format(", each whole (parallel.etp = 1; the tp ranks split the tokens)")
                   : "",
        double(e.expert_params_computed) / 1e6, mib(double(e.a2a_bytes_per_step)));
  if (e.cp > 1)
    fmt::print(
        "context parallel: parallel.cp {}, parallel.cp_comm_type={}{}: each rank holds {} of "
        "every row's {} tokens; attention exchanges {} sent per rank per step\n\n",
        e.cp, cfg.parallel.cp_comm_type,
        cfg.parallel.hierarchical_cp_sizes.size() == 2
            ? fmt::format(" (a2a {} × p2p {})", cfg.parallel.hierarchical_cp_sizes[0],
                          cfg.parallel.hierarchical_cp_sizes[1])
            : "",
        cfg.seq_len / e.cp, cfg.seq_len, mib(double(e.cp_bytes_per_step)));
  if (mc.has_adapters())
    fmt::print(
        "note: the adapters' (peft.*) own activation buffers are not in the estimate; their "
        "weights, gradients and optimizer state are\n\n");
  const bool meas = m.has_value();
  fmt::print("{:<46} {:>12}{}\n", "memory per rank", "estimate", meas ? "     measured" : "");
  auto row = [&](const std::string& what, double est, std::optional<double> got = {}) {
    fmt::print("{:<46} {:>12}{}\n", what, mib(est),
               got ? fmt::format(" {:>12}", mib(*got)) : std::string());
  };
  const OptimPrecision& pr = cfg.adamw.precision;
  const bool bf16_master = pr.master == DType::BF16;
  // A frozen base held without masters (adapters: bf16 alone, or QLoRA's NF4).
  const char* weights =
      bf16_master                                    ? "  weights (bf16, the master)"
      : cfg.frozen_weights == FrozenWeights::Nf4     ? "  weights (NF4 base, trained f32 masters)"
      : cfg.frozen_weights == FrozenWeights::Compute ? "  weights (bf16 base, trained f32 masters)"
      : cfg.dtype == DType::F32                      ? "  weights (f32 masters)"
                                                     : "  weights (f32 masters, bf16 copy)";
  row(weights, double(r.weight_bytes));
  // Sharded gradients (ZeRO-2, FSDP): this rank's blocks and what a
  // backward holds beside them, a bound on the run's grad_resident_bytes.
  const bool grads_sharded = r.grad_bytes < r.grad_arena_bytes;
  row(pr.grads == DType::BF16
          ? (grads_sharded ? "  gradients (bf16 + staging, sharded, bound)"
                           : "  gradients (bf16, f32 staging)")
          : (grads_sharded ? "  gradients (f32, sharded, at most)" : "  gradients (f32)"),
      double(r.grad_bytes));
  row(fmt::format("  optimizer state (moments {}{})", dtype_name(pr.moments),
                  bf16_master && pr.compensation ? ", remainder" : ""),
      double(r.optimizer_bytes));
  if (meas)
    row("  = weights, gradients and optimizer state",
        double(r.weight_bytes + r.grad_bytes + r.optimizer_bytes), m->persistent);
  row(fmt::format("  activations ({} micro-batch{} in flight)", r.in_flight,
                  r.in_flight == 1 ? "" : "es"),
      double(r.activation_bytes()));
  row("  workspaces (logits chunk, backward scratch)", double(r.workspace_bytes()));
  if (r.cp_buffer_bytes > 0)
    row(fmt::format("  cp buffers (parallel.cp_comm_type={})", cfg.parallel.cp_comm_type),
        double(r.cp_buffer_bytes));
  if (meas)
    row("  = activations and workspaces (planned)",
        double(r.activation_bytes() + r.workspace_bytes()), m->activations);
  row("  total of Nekton's tensors", double(r.total()),
      meas ? std::optional(m->peak) : std::nullopt);
  if (meas)
    fmt::print("{:<46} {:>12} {:>12}\n", "  process peak RSS (libraries, allocator slack)", "",
               mib(m->rss));
  fmt::print("\nFLOPs per step (Megatron's formula): {:.3e}", e.flops_per_step);
  if (e.recompute_flops > 0)
    fmt::print(", recompute adds {:.3e} ({:.1f}%)", e.recompute_flops,
               100.0 * e.recompute_flops / e.flops_per_step);
  fmt::print("\n");
  if (rates) {
    fmt::print(
        "step time, predicted: {:.3f} s (GEMMs {:.3f}, attention {:.3f}, memory-bound {:.3f}){}\n",
        e.step.total(), e.step.gemm_s, e.step.attention_s, e.step.memory_s,
        meas ? fmt::format("; measured {:.3f} s ({:+.1f}%)", m->step_s,
                           100.0 * (e.step.total() - m->step_s) / m->step_s)
             : "");
    fmt::print("  rates of {} (--rates, or {})\n", rates->machine,
               a.rates.empty() ? rates_cache_path() : a.rates);
  }
  if (align && !reference["needs_reference"].get<bool>())
    fmt::print("\nalign.method={}: no reference model\n", ac.method);
  if (align && reference["needs_reference"].get<bool>()) {
    const std::string chosen = reference["reference"];
    auto mark = [&](const char* r) { return chosen == r ? "  <- align.reference" : ""; };
    fmt::print(
        "\nalign.method={}: the reference model's log-probabilities, per rank beside the "
        "above\n",
        ac.method);
    fmt::print(
        "  {:<12} {:>12}  one forward pass over the data before step 1, then 8 bytes per "
        "sequence{}\n",
        "precompute", mib(0), mark("precompute"));
    fmt::print(
        "  {:<12} {:>12}  a frozen copy: weights {} ({}), its forward's workspace {}; a "
        "forward per micro-batch{}\n",
        "copy",
        mib(double(reference["copy"]["weight_bytes"].get<int64_t>() +
                   reference["copy"]["activation_bytes"].get<int64_t>())),
        mib(double(reference["copy"]["weight_bytes"].get<int64_t>())), dtype_name(cfg.dtype),
        mib(double(reference["copy"]["activation_bytes"].get<int64_t>())), mark("copy"));
    fmt::print(
        "  {:<12} {:>12}  the policy with its adapters off (peft.method): a forward per "
        "micro-batch{}\n",
        "adapter_off", mib(0), mark("adapter_off"));
  }
  if (!critic.is_null()) {
    auto bytes = [&](const char* k) { return double(critic[k].get<int64_t>()); };
    fmt::print(
        "\nalign.value_model: PPO's critic, {:.2f}M parameters, per rank beside the above "
        "{}\n  weights {}, gradients {}, optimizer state {}, activations {} (1 micro-batch)\n",
        bytes("params") / 1e6,
        mib(bytes("weight_bytes") + bytes("gradient_bytes") + bytes("optimizer_bytes") +
            bytes("activation_bytes")),
        mib(bytes("weight_bytes")), mib(bytes("gradient_bytes")), mib(bytes("optimizer_bytes")),
        mib(bytes("activation_bytes")));
  }
  if (!fits.is_null()) {
    fmt::print("\nwithin {} GiB per rank: largest micro-batch", a.budget_gib);
    for (const char* p : {"none", "selective", "full"})
      fmt::print(" {} {}", p, fits["largest_micro_batch"][p].get<int64_t>());
    fmt::print("; at micro-batch {}: {}\n", cfg.micro_batch,
               fits["cheapest_recompute"].is_null()
                   ? "nothing fits"
                   : "train.recompute=" + fits["cheapest_recompute"].get<std::string>());
  }
  return 0;
}

}  // namespace nk
