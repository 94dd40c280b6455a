#include "train/layout_search.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "parallel/pipeline_parallel.h"

namespace nk {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// The parallel.vp values to try at pp stages: the recipe's (1 when the
// search changes pp), or with `search` every count of virtual stages that
// splits the layers evenly over pp x vp chunks, and 1 where uneven splits
// are searched (pp not dividing the layers).
std::vector<int64_t> vp_counts(const TrainConfig& c, int64_t pp, bool search, bool splits) {
  if (!search || pp == 1) return {pp == c.parallel.mesh.pp ? c.parallel.vp : 1};
  std::vector<int64_t> v;
  if (splits && pp <= c.model.n_layer) v.push_back(1);
  for (int64_t k = 1; k * pp <= c.model.n_layer; ++k)
    if (c.model.n_layer % (k * pp) == 0 && !(k == 1 && splits)) v.push_back(k);
  return v;
}

// A context-parallel size with its parallel.cp_comm_type: the type and
// a2a+p2p's group sizes.
struct LayoutCp {
  int64_t cp = 1;
  std::string type;
  std::vector<int64_t> sizes;
};

// The cp sizes to try (every divisor of `ranks` with search_cp, else 1),
// each with the cp_comm_type settings to try at it: with search_cp_comm and
// cp > 1 p2p, a2a, all_gather and a2a+p2p at every split a x p = cp with
// a, p >= 2 (a split with a 1 is p2p or a2a again: the same layout under
// another name); else the recipe's. Which of them train is the trainer's
// checks' to say (ParallelConfig::check, check_train_layout), not this list's.
std::vector<LayoutCp> cp_choices(const TrainConfig& c, int64_t ranks,
                                 const LayoutSearchOptions& opt) {
  std::vector<LayoutCp> v;
  for (int64_t cp = 1; cp <= (opt.search_cp ? ranks : 1); ++cp) {
    if (ranks % cp) continue;
    if (!opt.search_cp_comm || cp == 1) {
      v.push_back({cp, c.parallel.cp_comm_type, c.parallel.hierarchical_cp_sizes});
      continue;
    }
    for (const char* type : {"p2p", "a2a", "all_gather"}) v.push_back({cp, type, {}});
    for (int64_t a = 2; a * 2 <= cp; ++a)
      if (cp % a == 0) v.push_back({cp, "a2a+p2p", {a, cp / a}});
  }
  return v;
}

const char* shard_key(parallel::Shard s) {
  return s == parallel::Shard::Full        ? "full"
         : s == parallel::Shard::Gradients ? "grads"
         : s == parallel::Shard::Optimizer ? "optimizer"
                                           : "none";
}

// The bytes one rank moves per step (ring collectives; no overlap with
// compute is assumed):
//  DP: the gradients, 2 (dp-1)/dp of their bytes (all-reduce, or ZeRO-1's
//      reduce-scatter + all-gather of the weights); ZeRO-2 (m + 1) (dp-1)/dp
//      (every micro-batch's reduce-scatter); FSDP 3 (dp-1)/dp (the weights
//      are gathered for the forward and again for the backward), m + 2 where
//      it reduces every micro-batch (without a pipeline);
//  TP: per layer and micro-batch 4 all-reduces (2 forward, 2 backward; with
//      sp the same bytes as reduce-scatter + all-gather), 2 more for a
//      fully recomputed layer, each 2 (tp-1)/tp of a B x T x C activation;
//  PP: per micro-batch the activation sent forward and its gradient sent
//      back, B x T x C (1/tp of it with sp);
//  MoE: the expert all-to-alls of the estimate.
double comm_bytes(const TrainConfig& c, const TrainEstimate& e) {
  const double s = double(dtype_size(c.dtype));
  const double act = double(c.micro_batch * c.seq_len * c.model.d_model) * s;
  const double m = double(c.grad_accum() / e.dp);
  double grads = 0;
  for (const RankEstimate& r : e.stages)
    grads = std::max(grads, double(r.params) * double(dtype_size(c.adamw.precision.grads)));
  double bytes = 0;
  const double reductions = e.pp == 1 ? m : 1.0;
  const double passes = c.ddp.shard == parallel::Shard::Full        ? reductions + 2.0
                        : c.ddp.shard == parallel::Shard::Gradients ? m + 1.0
                                                                    : 2.0;
  if (e.dp > 1) bytes += passes * double(e.dp - 1) / double(e.dp) * grads;
  const auto [layers, full] = busiest_stage(c, e.pp);
  if (e.tp > 1)
    bytes += m * double(4 * layers + 2 * full) * 2.0 * double(e.tp - 1) / double(e.tp) * act;
  if (e.pp > 1) bytes += m * 2.0 * act / (c.parallel.sequence_parallel ? double(e.tp) : 1.0);
  return bytes + double(e.a2a_bytes_per_step);
}

}  // namespace

nlohmann::json LayoutCandidate::to_json() const {
  nlohmann::json j = {{"tp", tp},
                      {"pp", pp},
                      {"dp", dp},
                      {"ep", ep},
                      {"cp", cp},
                      {"vp", vp},
                      {"sp", sp},
                      {"shard", shard},
                      {"micro_batch", micro_batch},
                      {"recompute", recompute},
                      {"accepted", accepted}};
  if (!pp_layout.empty()) j["pp_layout"] = pp_layout;
  if (cp > 1) {
    j["cp_comm_type"] = cp_comm;
    if (!hierarchical_cp_sizes.empty()) j["hierarchical_cp_sizes"] = hierarchical_cp_sizes;
  }
  if (!accepted) {
    j["reason"] = reason;
    if (memory_bytes > 0) j["memory_bytes"] = memory_bytes;
    return j;
  }
  j["memory_bytes"] = memory_bytes;
  j["comm_bytes"] = comm_bytes;
  if (comm_messages > 0) j["comm_messages"] = comm_messages;
  j["bubble"] = bubble;
  j["overrides"] = overrides;
  if (compute_s > 0)
    j["step_seconds"] = {{"compute", compute_s}, {"comm", comm_s}, {"total", step_s()}},
    j["tokens_per_s"] = tokens_per_s;
  return j;
}

std::string LayoutCandidate::name() const {
  std::string comm;
  if (cp > 1) {
    comm = " " + cp_comm;
    if (!hierarchical_cp_sizes.empty())
      comm += " " + fmt::format("{}", fmt::join(hierarchical_cp_sizes, "x"));
  }
  const std::string split =
      pp_layout.empty() ? "" : fmt::format(" [{}]", fmt::join(pp_layout, ","));
  return fmt::format("tp{} cp{}{} pp{}{} vp{} dp{}{}{} mb{} {}", tp, cp, comm, pp, split, vp, dp,
                     sp ? " sp" : "", shard == "none" ? "" : " " + shard, micro_batch, recompute);
}

std::vector<std::vector<int64_t>> pipeline_splits(const TrainConfig& cfg, int64_t pp) {
  const int64_t L = cfg.model.n_layer, mid = pp - 2;
  std::vector<std::vector<int64_t>> v;
  if (pp < 2 || L < pp) return v;
  auto even = [&](const std::vector<int64_t>& s) {
    return std::all_of(s.begin(), s.end(), [&](int64_t n) { return n * pp == L; });
  };
  if (L % pp == 0) v.push_back({});  // even: no key
  const std::vector<int64_t>& recipe = cfg.parallel.pp_layout;
  const bool own = pp == cfg.parallel.mesh.pp && cfg.parallel.vp == 1 && !recipe.empty() &&
                   int64_t(recipe.size()) == pp && !even(recipe);
  if (own) v.push_back(recipe);
  // First and last stages of up to twice an even one's layers (past that
  // the other stages wait on them whatever the head costs); the last may
  // hold the head alone.
  const int64_t most = std::min(L - 1 - mid, 2 * ((L + pp - 1) / pp));
  for (int64_t f = 1; f <= most; ++f)
    for (int64_t l = 0; l <= most && f + l + mid <= L; ++l) {
      const int64_t rest = L - f - l;
      if (mid == 0 ? rest != 0 : rest % mid != 0 || rest / mid < 1) continue;
      std::vector<int64_t> s(size_t(pp), mid > 0 ? rest / mid : 0);
      s.front() = f, s.back() = l;
      if (!even(s) && !(own && s == recipe)) v.push_back(std::move(s));
    }
  return v;
}

namespace {

// One layout's estimate: through the trainer's checks, within the budget,
// timed where there are rates. `k` names the layout; `c` is the recipe set
// to it. Returns `k` accepted with its memory, bytes and times, or refused
// with the reason.
LayoutCandidate evaluate(LayoutCandidate k, const TrainConfig& c, const LayoutSearchOptions& opt) {
  const int64_t N = opt.world;
  TrainEstimate e;
  try {
    // The trainer's checks: the config's, then the mesh's and the layout's
    // (train_mesh, inside estimate_training).
    c.parallel.check();
    c.ddp.check();
    e = estimate_training(c, N, nullptr);
  } catch (const Error& err) {
    k.reason = err.what();
    return k;
  }
  k.memory_bytes = e.peak().total();
  if (opt.budget_bytes > 0 && double(k.memory_bytes) > opt.budget_bytes) {
    k.reason = fmt::format("memory {:.1f} MiB per rank is over --budget {:.3f} GiB",
                           double(k.memory_bytes) / 1048576.0, opt.budget_bytes / 1073741824.0);
    return k;
  }
  k.accepted = true;
  k.comm_bytes = comm_bytes(c, e);
  const double m = double(c.grad_accum() / k.dp);
  k.bubble = double(k.pp - 1) / (m + double(k.pp - 1));
  if (!opt.rates) return k;
  measure_missing_rates(c, *opt.rates);
  const TrainEstimate t = estimate_training(c, N, opt.rates);
  if (opt.calibration) {
    const StepPrediction p = predict_step(c, t, *opt.calibration);
    k.compute_s = p.compute_s + p.overhead_s;
    k.comm_s = p.comm_s;
    k.comm_bytes = p.comm_bytes;
    k.comm_messages = p.messages;
    k.bubble = double(k.pp - 1) / double(k.vp) / (m + double(k.pp - 1) / double(k.vp));
  } else {
    k.compute_s = t.step.total();
    k.comm_s = k.comm_bytes / (opt.link_gbps * 1e9 / 8.0);
  }
  k.tokens_per_s = double(c.global_batch * c.seq_len) / k.step_s();
  return k;
}

}  // namespace

std::vector<LayoutCandidate> search_layouts(const TrainConfig& cfg,
                                            const LayoutSearchOptions& opt) {
  const int64_t N = opt.world;
  if (N < 1) fail("--search needs a world size (--nproc N), got {}", N);
  if (!(opt.link_gbps > 0)) fail("--link-gbps must be positive, got {}", opt.link_gbps);
  const ModelConfig& mc = cfg.model;
  std::vector<LayoutCandidate> out;
  for (int64_t tp : divisors(N))
    for (int64_t pp : divisors(N / tp))
      for (const LayoutCp& cc : cp_choices(cfg, N / (tp * pp), opt))
        for (int64_t vp : vp_counts(cfg, pp, opt.search_vp, opt.search_pp_layout && opt.rates)) {
          const int64_t cp = cc.cp;
          const int64_t dp = N / (tp * pp * cp);
          // The type is among the overrides when the search chose it.
          const bool comm_searched = opt.search_cp && opt.search_cp_comm && cp > 1;
          LayoutCandidate base;
          base.tp = tp, base.pp = pp, base.dp = dp, base.ep = cfg.parallel.mesh.ep;
          base.cp = opt.search_cp ? cp : cfg.parallel.mesh.cp;
          base.cp_comm = cc.type, base.hierarchical_cp_sizes = cc.sizes;
          base.vp = opt.search_vp ? vp : (pp == cfg.parallel.mesh.pp ? cfg.parallel.vp : 1);
          base.micro_batch = cfg.micro_batch, base.recompute = cfg.recompute;
          base.shard = shard_key(cfg.ddp.shard);
          // The recipe's vp and pp_layout hold (unless vp is searched: even
          // splits), or with search_pp_layout a one-chunk pipeline tries
          // pipeline_splits.
          const bool own_layout = pp == cfg.parallel.mesh.pp && !opt.search_vp;
          const bool split_searched = opt.search_pp_layout && opt.rates && pp > 1 && base.vp == 1;
          const std::vector<std::vector<int64_t>> splits =
              split_searched ? pipeline_splits(cfg, pp)
                             : std::vector<std::vector<int64_t>>{
                                   own_layout ? cfg.parallel.pp_layout : std::vector<int64_t>{}};
          if (split_searched && splits.empty()) {
            base.reason = fmt::format("parallel.pp = {}: more stages than model.n_layer = {}", pp,
                                      mc.n_layer);
            out.push_back(base);
            continue;
          }
          if (!own_layout && !split_searched && mc.n_layer % pp) {
            base.reason = fmt::format(
                "parallel.pp = {}: does not divide model.n_layer = {} (the search splits the "
                "layers evenly)",
                pp, mc.n_layer);
            out.push_back(base);
            continue;
          }
          if (cfg.global_batch % dp) {
            base.reason = fmt::format(
                "train.global_batch = {} is not a multiple of the data-parallel size {} (world {} "
                "/ "
                "(tp {} x pp {} x cp {}))",
                cfg.global_batch, dp, N, tp, pp, cp);
            out.push_back(base);
            continue;
          }
          // Expert parallelism (a Mixture-of-Experts model): carved out of the
          // data-parallel ranks, every divisor of dp (the trainer refuses those
          // that do not split the experts evenly); else the recipe's value.
          const std::vector<int64_t> eps =
              mc.is_moe() ? divisors(dp) : std::vector<int64_t>{cfg.parallel.mesh.ep};
          for (int64_t ep : eps)
            for (bool sp : {false, true}) {
              if (sp && tp == 1) continue;  // ParallelConfig::check's rule: nothing to split
              for (parallel::Shard shard : {parallel::Shard::None, parallel::Shard::Optimizer,
                                            parallel::Shard::Gradients, parallel::Shard::Full})
                for (int64_t mb : divisors(cfg.global_batch / dp))
                  for (const char* policy : {"none", "selective", "full"}) {
                    LayoutCandidate k = base;
                    k.ep = ep, k.sp = sp, k.shard = shard_key(shard), k.micro_batch = mb,
                    k.recompute = policy;
                    if (shard != parallel::Shard::None && dp == 1) {
                      k.reason = fmt::format(
                          "parallel.shard = {}: nothing to shard with one data-parallel rank (the "
                          "same as none)",
                          k.shard);
                      out.push_back(k);
                      continue;
                    }
                    TrainConfig c = cfg;
                    c.parallel.mesh.tp = int(tp);
                    c.parallel.mesh.pp = int(pp);
                    c.parallel.mesh.dp = int(dp);
                    c.parallel.mesh.ep = int(ep);
                    if (opt.search_cp) c.parallel.mesh.cp = int(cp);
                    c.parallel.set_cp_comm(cc.type, cc.sizes);
                    c.parallel.sequence_parallel = sp;
                    if (!own_layout) c.parallel.vp = int(k.vp);
                    c.ddp.shard = shard;
                    c.micro_batch = mb;
                    c.recompute = policy;
                    // Each split in turn; the fastest accepted one stays
                    // (the first, the even one, on a tie), else the first's
                    // refusal.
                    std::optional<LayoutCandidate> best;
                    for (const std::vector<int64_t>& split : splits) {
                      c.parallel.pp_layout = split;
                      LayoutCandidate x = k;
                      x.pp_layout = split;
                      x = evaluate(std::move(x), c, opt);
                      if (!best || (x.accepted && (!best->accepted || x.step_s() < best->step_s())))
                        best = std::move(x);
                    }
                    k = std::move(*best);
                    if (!k.accepted) {
                      out.push_back(k);
                      continue;
                    }
                    k.overrides = {fmt::format("parallel.tp={}", tp),
                                   fmt::format("parallel.pp={}", pp),
                                   fmt::format("parallel.dp={}", dp),
                                   fmt::format("parallel.sp={}", sp ? "true" : "false"),
                                   fmt::format("parallel.shard={}", k.shard),
                                   fmt::format("train.micro_batch={}", mb),
                                   fmt::format("train.recompute={}", policy)};
                    if (mc.is_moe()) k.overrides.push_back(fmt::format("parallel.ep={}", ep));
                    if (opt.search_cp) k.overrides.push_back(fmt::format("parallel.cp={}", cp));
                    if (comm_searched) {
                      k.overrides.push_back("parallel.cp_comm_type=" + cc.type);
                      if (!cc.sizes.empty())
                        k.overrides.push_back(
                            fmt::format("parallel.hierarchical_context_parallel_sizes={}",
                                        fmt::join(cc.sizes, ",")));
                    }
                    if (opt.search_vp || (!own_layout && cfg.parallel.vp != 1))
                      k.overrides.push_back(fmt::format("parallel.vp={}", k.vp));
                    if (!k.pp_layout.empty())
                      k.overrides.push_back(
                          fmt::format("parallel.pp_layout={}", fmt::join(k.pp_layout, ",")));
                    else if (!cfg.parallel.pp_layout.empty())
                      k.overrides.push_back("parallel.pp_layout=");  // an even split
                    out.push_back(k);
                  }
            }
        }
  const bool timed = opt.rates != nullptr;
  std::stable_sort(out.begin(), out.end(), [&](const LayoutCandidate& a, const LayoutCandidate& b) {
    if (a.accepted != b.accepted) return a.accepted;
    if (!a.accepted) return false;
    if (timed && a.step_s() != b.step_s()) return a.step_s() < b.step_s();
    if (a.memory_bytes != b.memory_bytes) return a.memory_bytes < b.memory_bytes;
    return a.comm_bytes < b.comm_bytes;
  });
  return out;
}

}  // namespace nk
