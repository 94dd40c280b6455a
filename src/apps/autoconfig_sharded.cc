// autoconfig's calibrations of the sharded layouts (AutoconfigRuns::
// calibrate_fsdp, calibrate_zero2): fully sharded and ZeRO-2 runs of the
// recipe on the host's ranks, each against the model, in a sharding group
// of all of them and in one of 2.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apps/autoconfig_probe.h"
#include "apps/autoconfig_runs.h"
#include "core/error.h"
#include "core/log.h"
#include "train/step_calibration.h"

namespace nk {

void AutoconfigRuns::calibrate_fsdp(const TrainConfig& cfg, MachineRates& rates,
                                    StepCalibration& cal) {
  // On as many of the host's ranks as the batch splits over (all, when it
  // does): FSDP's gathers fault pages in on every rank at once.
  const int64_t G = cfg.global_batch, P = autoconfig::divisor_at_most(G, cal.procs_per_node);
  fsdp_probes_.clear();
  fsdp_fit_ = "page probe";
  if (P < 2) return;  // no sharded layout on this host
  // The page probe's cost per byte is the least a gathered byte can cost:
  // every gather writes into pages handed back after their last use.
  const double page = cal.page_refault_s_per_byte;
  std::map<std::string, std::vector<double>> pooled;  // steps by run, over the rounds
  // A fully sharded probe's layout as the model sees it (tp x dp = P,
  // micro-batch mb, global batch `batch`), and the calibration it is
  // predicted with.
  struct ProbeModel {
    TrainConfig c;
    TrainEstimate e;
    StepCalibration at;
  };
  auto model_of = [&](int64_t tp, int64_t mb, int64_t batch) {
    ProbeModel m{autoconfig::probe_config(cfg, int(tp), 1, int(P / tp), mb), {}, cal};
    m.c.global_batch = batch;
    m.c.ddp.shard = parallel::Shard::Full;
    m.at.procs_per_node = P;
    m.at.sharing = measure_sharing(P);  // (cached: the host's)
    m.at.fsdp_pair_step_s = m.at.fsdp_pair_refault_s_per_byte = -1;
    m.e = autoconfig::probe_estimate(m.c, P, rates);
    return m;
  };
  // The probe's step predicted at per_byte and per_step (FSDP's costs), and
  // what one more ns a byte and one more ms a step add to it there (the
  // slopes a fit solves with).
  auto linearize = [](FsdpProbe& f, ProbeModel& m, double per_byte, double per_step) {
    m.at.refault_s_per_byte = per_byte, m.at.fsdp_step_s = per_step;
    StepCalibration b = m.at, st = m.at;
    b.refault_s_per_byte += 1e-9, st.fsdp_step_s += 1e-3;
    f.predicted_s = predict_step(m.c, m.e, m.at).total();
    f.per_s_per_byte = (predict_step(m.c, m.e, b).total() - f.predicted_s) / 1e-9;
    f.per_step_s = (predict_step(m.c, m.e, st).total() - f.predicted_s) / 1e-3;
  };
  // One fully sharded run, against the model with FSDP's costs free
  // (predicted_s and the slopes at 0).
  auto probe = [&](int64_t tp, int64_t mb, int64_t batch, int round) -> std::optional<FsdpProbe> {
    FsdpProbe f;
    f.tp = tp, f.micro_batch = mb, f.global_batch = batch;
    try {
      ProbeModel m = model_of(tp, mb, batch);
      linearize(f, m, 0, 0);
    } catch (const Error& e) {
      NK_WARN(
          "autoconfig: no fully sharded probe at tp {}, micro-batch {}, global batch {} for this "
          "recipe ({})",
          tp, mb, batch, e.what());
      return std::nullopt;
    }
    std::vector<std::string> extra =
        autoconfig::probe_overrides(int(tp), 1, int(P / tp), mb, cal.threads);
    std::replace(extra.begin(), extra.end(), std::string("parallel.shard=none"),
                 std::string("parallel.shard=full"));
    extra.push_back(fmt::format("train.global_batch={}", batch));
    const std::string name = fmt::format("probe-fsdp-tp{}-dp{}-mb{}-gb{}", tp, P / tp, mb, batch);
    const MeasuredRun r = run(name + (round > 1 ? fmt::format("-{}", round) : ""), P, extra,
                              autoconfig::kProbeSteps, f.predicted_s);
    if (!r.ok() || !(f.per_s_per_byte > 0) || !(f.per_step_s > 0)) {
      NK_WARN(
          "autoconfig: the fully sharded probe at tp {}, micro-batch {}, global batch {} failed "
          "({}, {})",
          tp, mb, batch, r.result.describe(), r.log);
      return std::nullopt;
    }
    std::vector<double>& steps = pooled[name];
    steps.insert(steps.end(), r.steps_s.begin() + 1, r.steps_s.end());
    f.measured_s = autoconfig::median(steps);
    f.fitted_s = f.predicted_s;
    return f;
  };
  auto fits_of = [](const std::vector<FsdpProbe>& probes) {
    std::vector<FsdpProbeFit> out;
    for (const FsdpProbe& p : probes)
      out.push_back({p.measured_s - p.predicted_s, p.per_s_per_byte, p.per_step_s});
    return out;
  };
  // fit_fsdp, then again on the model linearized at the fit until it stops
  // moving (at most 30 times, each step halved while it misses the probes more): where the model
  // bends (a message's wait, capped by a share of the step, rises with FSDP's costs until the cap
  // no longer binds) a fit on the slopes at 0 missed a tp 2 probe's step by
  // 5 %. Each probe's fitted_s and slopes are then the model's at the fit.
  // `exact` (as many probes as costs): the fit stands only where it reaches
  // every probe's measured step (to 1e-7 of it); a refinement that stopped
  // short (its next fit out of bounds, or no step that helps: the probes'
  // noise put the solution past a bend) leaves the other fits to the caller.
  auto fit_and_refine = [&](std::vector<FsdpProbe>& probes, StepCalibration& into, bool exact) {
    if (!fit_fsdp(into, fits_of(probes), page)) return false;
    std::vector<ProbeModel> models;
    for (const FsdpProbe& p : probes)
      models.push_back(model_of(p.tp, p.micro_batch, p.global_batch));
    // The probes' squared misses at (per byte, per step).
    auto misses = [&](double b, double st) {
      double sum = 0;
      for (size_t i = 0; i < probes.size(); ++i) {
        FsdpProbe q = probes[i];
        linearize(q, models[i], b, st);
        sum += (q.measured_s - q.predicted_s) * (q.measured_s - q.predicted_s);
      }
      return sum;
    };
    // Damped: a step that misses the probes more is halved (a piecewise
    // model can send the plain step past the piece the solution lies in).
    for (int it = 0; it < 30; ++it) {
      std::vector<FsdpProbeFit> at;
      for (size_t i = 0; i < probes.size(); ++i) {
        FsdpProbe q = probes[i];
        linearize(q, models[i], into.refault_s_per_byte, into.fsdp_step_s);
        at.push_back({q.measured_s - q.predicted_s + q.per_s_per_byte * into.refault_s_per_byte +
                          q.per_step_s * into.fsdp_step_s,
                      q.per_s_per_byte, q.per_step_s});
      }
      StepCalibration next = into;
      if (!fit_fsdp(next, at, page)) break;  // (the last fit stands)
      const double now = misses(into.refault_s_per_byte, into.fsdp_step_s);
      double b = next.refault_s_per_byte, st = next.fsdp_step_s, after = misses(b, st);
      for (int h = 0; h < 30 && after > now; ++h) {
        b = 0.5 * (b + into.refault_s_per_byte), st = 0.5 * (st + into.fsdp_step_s);
        after = misses(b, st);
      }
      if (after > now) break;  // no step helps: converged as far as it goes
      const bool still = std::abs(b - into.refault_s_per_byte) <= 1e-12 * into.refault_s_per_byte &&
                         std::abs(st - into.fsdp_step_s) <= 1e-15;
      into.refault_s_per_byte = b, into.fsdp_step_s = st;
      if (still) break;
    }
    if (exact)
      for (size_t i = 0; i < probes.size(); ++i) {
        FsdpProbe q = probes[i];
        linearize(q, models[i], into.refault_s_per_byte, into.fsdp_step_s);
        if (!(std::abs(q.predicted_s - q.measured_s) <= 1e-7 * q.measured_s)) return false;
      }
    return true;
  };
  // Each probe's step at the costs taken, and the slopes there.
  auto at_fit = [&](std::vector<FsdpProbe>::iterator from, double per_byte, double per_step) {
    for (auto it = from; it != fsdp_probes_.end(); ++it) {
      FsdpProbe q = *it;
      ProbeModel m = model_of(q.tp, q.micro_batch, q.global_batch);
      linearize(q, m, per_byte, per_step);
      it->fitted_s = q.predicted_s;
      it->per_s_per_byte = q.per_s_per_byte, it->per_step_s = q.per_step_s;
    }
  };
  // One round of the data-parallel probes: one sequence per micro-batch
  // (the most gathers the recipe's batch makes), one micro-batch per rank
  // (the fewest), and one sequence per micro-batch of twice the batch
  // (twice the most: a layout that shards over fewer data-parallel ranks,
  // cp 2 x dp P/2, gathers that often, and a fit of the first two alone
  // extrapolated to it 2x, its error -32 to +36 % over twelve grids on 4
  // ranks of the 2-core VM, 2026-12-04, where its measured step moved 5 %).
  auto dp_probes = [&](int round) {
    std::vector<FsdpProbe> out;
    const std::pair<int64_t, int64_t> runs[] = {{1, G}, {G / P, G}, {1, 2 * G}};
    for (const auto& [mb, batch] : runs) {
      if (!out.empty() && mb == out[0].micro_batch && batch == out[0].global_batch) continue;
      if (std::optional<FsdpProbe> f = probe(1, mb, batch, round)) out.push_back(*f);
    }
    return out;
  };
  fsdp_probes_ = dp_probes(1);
  if (fsdp_probes_.empty()) {
    NK_WARN("autoconfig: FSDP's gathers costed by the page probe, {:.2f} ns a byte",
            cal.refault_s_per_byte * 1e9);
    return;
  }
  if (fsdp_probes_.size() == 1) {  // one probe ran: per byte
    const FsdpProbe& a = fsdp_probes_[0];
    const double per_byte = (a.measured_s - a.predicted_s) / a.per_s_per_byte;
    if (per_byte > 0 && per_byte >= page) {
      cal.refault_s_per_byte = per_byte;
      fsdp_fit_ = "one probe per byte";
    } else {
      NK_WARN(
          "autoconfig: the fully sharded probe gives {:.2f} ns a byte past the model with free "
          "gathers, under the page probe's (noise); FSDP's gathers costed by the page probe, "
          "{:.2f} ns a byte",
          per_byte * 1e9, page * 1e9);
    }
    at_fit(fsdp_probes_.begin(), cal.refault_s_per_byte, 0);
    return;
  }
  // All once more, their steps pooled (as the message and ring probes): the
  // fit splits the probes' differences between a per-byte and a per-step
  // cost, and one round each on 4 ranks of the 2-core VM traded them from
  // 1.93 ns + 5.6 ms to 0.71 ns + 29.8 ms between two grids minutes apart.
  // A fit is taken only at a per-byte cost of at least the page probe's
  // (fit_fsdp).
  const size_t first = fsdp_probes_.size();
  fsdp_fit_ = fmt::format("{} probes", first);
  if (std::vector<FsdpProbe> again = dp_probes(2); again.size() == first) {
    fsdp_probes_ = again;
    fsdp_fit_ += ", two rounds";
  }
  const std::vector<FsdpProbeFit> fits = fits_of(fsdp_probes_);
  bool ok = fit_and_refine(fsdp_probes_, cal, false);
  if (!ok && fit_fsdp_per_byte(cal, fits, page)) {
    ok = true;
    fsdp_fit_ = fmt::format("{} probes per byte alone", fits.size());
  }
  if (!ok) {
    std::vector<std::string> past;
    for (const FsdpProbeFit& f : fits) past.push_back(fmt::format("{:.1f}", f.extra_s * 1e3));
    NK_WARN(
        "autoconfig: the fully sharded probes ({} ms past the model) give no positive cost per "
        "byte of at least the page probe's {:.2f} ns (noise); that, and per step the least any "
        "probe leaves past it",
        fmt::join(past, ", "), page * 1e9);
    fit_fsdp_at_page(cal, fits, page);
    fsdp_fit_ = "page probe per byte, the probes per step";
  }
  at_fit(fsdp_probes_.begin(), cal.refault_s_per_byte, cal.fsdp_step_s);
  cal.fsdp_group = P;
  // More than 2 ranks: both costs in a sharding group of 2 (tp 2 x dp P/2),
  // from a pair of probes as the group's (the fewest gathers, one
  // micro-batch per rank; the most, one sequence per micro-batch), in two
  // rounds; when they give no fit, the per-step cost alone at the group's
  // per-byte cost, from the fewest-gathers probe.
  if (P <= 2 || P % 2 != 0 || G % (P / 2) != 0) return;
  auto pair_probes = [&](int round) {
    std::vector<FsdpProbe> out;
    for (const int64_t mb : {G / (P / 2), int64_t(1)}) {
      if (!out.empty() && mb == out[0].micro_batch) continue;
      if (std::optional<FsdpProbe> f = probe(2, mb, G, round)) out.push_back(*f);
    }
    return out;
  };
  std::vector<FsdpProbe> pairs = pair_probes(1);
  if (pairs.empty()) return;
  if (pairs.size() == 2)
    if (std::vector<FsdpProbe> again = pair_probes(2); again.size() == 2) pairs = again;
  StepCalibration pc = cal;
  if (pairs.size() == 2 && fit_and_refine(pairs, pc, true)) {
    fsdp_pair_fit_ = "two probes";
  } else if (pairs.size() == 2 && fit_fsdp_per_byte(pc, fits_of(pairs), page)) {
    fsdp_pair_fit_ = "two probes per byte alone";
  } else {
    const FsdpProbe& few = pairs[0];
    pc.refault_s_per_byte = cal.refault_s_per_byte;
    pc.fsdp_step_s = std::max(
        0.0, (few.measured_s - few.predicted_s - cal.refault_s_per_byte * few.per_s_per_byte) /
                 few.per_step_s);
    fsdp_pair_fit_ = "the group's per byte, one probe per step";
  }
  cal.fsdp_pair_refault_s_per_byte = pc.refault_s_per_byte;
  cal.fsdp_pair_step_s = pc.fsdp_step_s;
  const size_t group = fsdp_probes_.size();
  fsdp_probes_.insert(fsdp_probes_.end(), pairs.begin(), pairs.end());
  at_fit(fsdp_probes_.begin() + ptrdiff_t(group), pc.refault_s_per_byte, pc.fsdp_step_s);
}

void AutoconfigRuns::calibrate_zero2(const TrainConfig& cfg, MachineRates& rates,
                                     StepCalibration& cal) {
  const int64_t G = cfg.global_batch, P = autoconfig::divisor_at_most(G, cal.procs_per_node);
  zero2_probe_ = zero2_pair_probe_ = {};
  if (P < 2) return;  // no sharded layout on this host
  // A ZeRO-2 run at tp x dp = P, one sequence per micro-batch, in two
  // rounds pooled (as the other probes on ranks sharing cores), and the
  // per-micro-batch cost at which the model predicts it: `field` of `at`
  // (the calibration to predict with; zero2_group P), solved for by
  // bisection (0 when the model without it already reaches the step).
  auto probe = [&](int64_t tp, Zero2Probe& out, StepCalibration at,
                   double StepCalibration::*field) -> std::optional<double> {
    TrainConfig c = autoconfig::probe_config(cfg, int(tp), 1, int(P / tp), 1);
    c.ddp.shard = parallel::Shard::Gradients;
    at.procs_per_node = P;
    at.sharing = measure_sharing(P);  // (cached: the host's)
    at.zero2_group = P;
    at.*field = 0;
    TrainEstimate e;
    try {
      e = autoconfig::probe_estimate(c, P, rates);
    } catch (const Error& err) {
      NK_WARN("autoconfig: no ZeRO-2 probe at tp {} for this recipe ({})", tp, err.what());
      return std::nullopt;
    }
    const double without = predict_step(c, e, at).total();
    std::vector<std::string> extra =
        autoconfig::probe_overrides(int(tp), 1, int(P / tp), 1, cal.threads);
    extra.push_back("parallel.shard=grads");
    std::vector<double> steps;
    for (int round = 1; round <= 2; ++round) {
      const MeasuredRun r = run(fmt::format("probe-zero2-tp{}{}", tp, round > 1 ? "-2" : ""), P,
                                extra, autoconfig::kProbeSteps, without);
      if (!r.ok()) {
        NK_WARN("autoconfig: the ZeRO-2 probe at tp {} failed ({}, {}){}", tp, r.result.describe(),
                r.log, steps.empty() ? "; not fitted" : "; fitted on one round");
        break;
      }
      steps.insert(steps.end(), r.steps_s.begin() + 1, r.steps_s.end());
    }
    if (steps.empty()) return std::nullopt;
    out = {double(G / (P / tp)), without, autoconfig::median(steps)};
    // The model rises with the cost, in pieces (the messages' capped wait,
    // the part recomputed forwards hide): bracketed, then bisected.
    auto predicted = [&](double z) {
      at.*field = z;
      return predict_step(c, e, at).total();
    };
    double lo = 0, hi = 1e-3;
    if (predicted(lo) >= out.measured_s) return 0.0;
    while (predicted(hi) < out.measured_s && hi < 1e3) lo = hi, hi *= 2;
    for (int it = 0; it < 100 && hi - lo > 1e-12 * hi; ++it) {
      const double mid = 0.5 * (lo + hi);
      (predicted(mid) < out.measured_s ? lo : hi) = mid;
    }
    return hi;
  };
  StepCalibration group = cal;
  group.zero2_pair_micro_batch_s = -1;
  const std::optional<double> z =
      probe(1, zero2_probe_, group, &StepCalibration::zero2_micro_batch_s);
  if (!z) return;
  cal.zero2_micro_batch_s = *z;
  cal.zero2_group = P;
  // More than 2 ranks: the cost in a sharding group of 2 (tp 2 x dp P/2):
  // on 4 ranks of the 2-core VM the group of 4's, scaled by the bytes'
  // share, put tp 2 x dp 2 ZeRO-2 at 4 micro-batches a rank 44 % slow.
  if (P <= 2 || P % 2 != 0 || G % (P / 2) != 0) return;
  if (const std::optional<double> pair =
          probe(2, zero2_pair_probe_, cal, &StepCalibration::zero2_pair_micro_batch_s))
    cal.zero2_pair_micro_batch_s = *pair;
}

}  // namespace nk
