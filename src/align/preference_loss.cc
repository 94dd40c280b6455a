#include "align/preference_loss.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace nk {
namespace {

double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}
// log s(x) without overflow.
double log_sigmoid(double x) {
  return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
}
// log(1 - e^x) for x < 0 (Maechler's split keeps both ends accurate).
double log1mexp(double x) {
  return x < -M_LN2 ? std::log1p(-std::exp(x)) : std::log(-std::expm1(x));
}

// -(1-ls) log s(b z) - ls log s(-b z) (robust: the flipped term's sign and
// the 1/(1-2 ls) scale of rDPO) and its derivative in z.
std::pair<double, double> smoothed_sigmoid(double z, double beta, double ls, bool robust) {
  const double bz = beta * z;
  const double flip = robust ? -1.0 : 1.0, scale = robust ? 1.0 / (1.0 - 2.0 * ls) : 1.0;
  const double loss = (-(1 - ls) * log_sigmoid(bz) - flip * ls * log_sigmoid(-bz)) * scale;
  const double d = (-(1 - ls) * beta * sigmoid(-bz) + flip * ls * beta * sigmoid(bz)) * scale;
  return {loss, d};
}

// The chosen rows' token-mean NLL over the micro-batch, added with weight
// `alpha`: d/d logp of each chosen row is -alpha / (all chosen tokens).
void add_chosen_nll(double alpha, const PreferenceBatch& b, PreferenceLossResult& r) {
  const size_t n = b.logp.size() / 2;
  double logp = 0, tokens = 0;
  for (size_t i = 0; i < n; ++i) {
    logp += b.logp[2 * i];
    tokens += double(b.tokens[2 * i]);
  }
  r.figures.nll = -logp / tokens;
  if (alpha == 0) return;
  r.loss += alpha * r.figures.nll;
  for (size_t i = 0; i < n; ++i) r.dlogp[2 * i] += -alpha / tokens;
}

void pair_figures(const PreferenceBatch& b, size_t i, double chosen_reward, double rejected_reward,
                  PreferenceFigures& f) {
  f.chosen_reward_sum += chosen_reward;
  f.rejected_reward_sum += rejected_reward;
  f.chosen_logp_sum += b.logp[2 * i];
  f.rejected_logp_sum += b.logp[2 * i + 1];
  f.chosen += 1;
  f.rejected += 1;
  f.correct += chosen_reward > rejected_reward ? 1 : 0;
}

}  // namespace

PreferenceLossResult preference_loss(const PreferenceLossConfig& cfg, const PreferenceBatch& b) {
  const size_t rows = b.logp.size(), n = rows / 2;
  NK_CHECK(rows > 0 && rows % 2 == 0, "preference_loss: {} rows (two per pair)", rows);
  NK_CHECK(b.tokens.size() == rows, "preference_loss: {} token counts for {} rows", b.tokens.size(),
           rows);
  for (size_t i = 0; i < rows; ++i)
    NK_CHECK(b.tokens[i] > 0, "preference_loss: row {} has no completion token", i);
  if (cfg.needs_reference())
    NK_CHECK(b.ref_logp.size() == rows, "preference_loss: {} reference values for {} rows",
             b.ref_logp.size(), rows);
  PreferenceLossResult r;
  r.dlogp.assign(rows, 0.0);
  PreferenceFigures& f = r.figures;
  const double beta = cfg.beta, inv_n = 1.0 / double(n);
  switch (cfg.method) {
    case PreferenceMethod::Dpo:
      for (size_t i = 0; i < n; ++i) {
        const size_t c = 2 * i, j = 2 * i + 1;
        const double dc = b.logp[c] - b.ref_logp[c], dr = b.logp[j] - b.ref_logp[j];
        double loss = 0, dz = 0, zc = 1, zr = 1;  // dz/dlogp of the chosen and rejected rows
        if (cfg.loss_type == DpoLoss::Ipo) {
          zc = 1.0 / double(b.tokens[c]);
          zr = 1.0 / double(b.tokens[j]);
          const double u = dc * zc - dr * zr - 1.0 / (2.0 * beta);
          loss = u * u;
          dz = 2.0 * u;
        } else if (cfg.loss_type == DpoLoss::Hinge) {
          const double h = 1.0 - beta * (dc - dr);
          loss = std::max(0.0, h);
          dz = h > 0 ? -beta : 0.0;
        } else {
          std::tie(loss, dz) = smoothed_sigmoid(dc - dr, beta, cfg.label_smoothing,
                                                cfg.loss_type == DpoLoss::Robust);
        }
        r.loss += loss * inv_n;
        r.dlogp[c] = dz * zc * inv_n;
        r.dlogp[j] = -dz * zr * inv_n;
        pair_figures(b, i, beta * dc, beta * dr, f);
      }
      add_chosen_nll(cfg.rpo_alpha, b, r);
      if (cfg.rpo_alpha == 0) f.nll = 0;
      break;
    case PreferenceMethod::Simpo:
      for (size_t i = 0; i < n; ++i) {
        const size_t c = 2 * i, j = 2 * i + 1;
        const double tc = double(b.tokens[c]), tr = double(b.tokens[j]);
        const double ac = b.logp[c] / tc, ar = b.logp[j] / tr;
        const auto [loss, dz] =
            smoothed_sigmoid(ac - ar - cfg.simpo_gamma / beta, beta, cfg.label_smoothing, false);
        r.loss += loss * inv_n;
        r.dlogp[c] = dz / tc * inv_n;
        r.dlogp[j] = -dz / tr * inv_n;
        pair_figures(b, i, beta * ac, beta * ar, f);
      }
      add_chosen_nll(cfg.cpo_alpha, b, r);
      break;
    case PreferenceMethod::Orpo:
      add_chosen_nll(1.0, b, r);
      for (size_t i = 0; i < n; ++i) {
        const size_t c = 2 * i, j = 2 * i + 1;
        const double tc = double(b.tokens[c]), tr = double(b.tokens[j]);
        const double ac = b.logp[c] / tc, ar = b.logp[j] / tr;
        const double t = (ac - ar) - (log1mexp(ac) - log1mexp(ar));
        r.loss -= beta * log_sigmoid(t) * inv_n;
        // d log s(t)/dt = s(-t); dt/dac = 1/(1 - e^ac), dt/dar = -1/(1 - e^ar).
        const double g = -beta * sigmoid(-t) * inv_n;
        r.dlogp[c] += g / -std::expm1(ac) / tc;
        r.dlogp[j] += -g / -std::expm1(ar) / tr;
        pair_figures(b, i, beta * ac, beta * ar, f);
      }
      break;
    case PreferenceMethod::Kto: {
      NK_CHECK(b.desirable.size() == n, "preference_loss: {} KTO labels for {} examples",
               b.desirable.size(), n);
      double kl = 0;
      for (size_t i = 0; i < n; ++i) kl += b.logp[2 * i + 1] - b.ref_logp[2 * i + 1];
      kl = std::max(0.0, kl * inv_n);
      f.kl = kl;
      for (size_t i = 0; i < n; ++i) {
        const size_t e = 2 * i;
        const double d = b.logp[e] - b.ref_logp[e];
        if (b.desirable[i]) {
          const double s = sigmoid(beta * (d - kl));
          r.loss += cfg.desirable_weight * (1 - s) * inv_n;
          r.dlogp[e] = -cfg.desirable_weight * beta * s * (1 - s) * inv_n;
          f.chosen_reward_sum += beta * d;
          f.chosen_logp_sum += b.logp[e];
          f.chosen += 1;
        } else {
          const double s = sigmoid(beta * (kl - d));
          r.loss += cfg.undesirable_weight * (1 - s) * inv_n;
          r.dlogp[e] = cfg.undesirable_weight * beta * s * (1 - s) * inv_n;
          f.rejected_reward_sum += beta * d;
          f.rejected_logp_sum += b.logp[e];
          f.rejected += 1;
        }
      }
      break;
    }
  }
  return r;
}

PreferenceMethod parse_preference_method(const std::string& s, const std::string& key) {
  if (s == "dpo") return PreferenceMethod::Dpo;
  if (s == "kto") return PreferenceMethod::Kto;
  if (s == "orpo") return PreferenceMethod::Orpo;
  if (s == "simpo") return PreferenceMethod::Simpo;
  fail("{}: '{}' is none of dpo, ipo, hinge, kto, orpo, simpo", key, s);
}

DpoLoss parse_dpo_loss(const std::string& s, const std::string& key) {
  if (s == "sigmoid") return DpoLoss::Sigmoid;
  if (s == "robust") return DpoLoss::Robust;
  if (s == "hinge") return DpoLoss::Hinge;
  if (s == "ipo") return DpoLoss::Ipo;
  fail("{}: '{}' is none of sigmoid, robust, hinge, ipo", key, s);
}

}  // namespace nk
