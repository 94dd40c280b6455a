// The preference-optimisation losses as pure functions of per-sequence sums:
// each sequence's log-probability under the policy (and the reference), and
// its completion token count, to the micro-batch's loss and d loss / d logp
// of every sequence. The model turns those into per-row gradient weights on
// the token cross-entropy (Transformer::head_row_backward), so one forward
// and one backward serve every loss here.
//
// Rows come in twos. Paired methods (DPO family, ORPO, SimPO): row 2i is
// pair i's chosen completion, row 2i+1 its rejected one. KTO: row 2i is
// example i, row 2i+1 example i's prompt with another example's completion
// (the mismatched sequence of KTO's KL estimate); label[i] says whether
// example i is desirable.
//
// Each follows its paper and TRL's trainers (names in brackets):
//   dpo    sigmoid  -(1-ls) log s(b z) - ls log s(-b z)   (DPO; cDPO with label_smoothing)
//          robust   (-(1-ls) log s(b z) + ls log s(-b z)) / (1 - 2 ls)   (rDPO)
//          hinge    max(0, 1 - b z)                       (SLiC / RSO)
//          ipo      (z' - 1/(2b))^2, z' with log-ratios divided by token counts (IPO as TRL)
//          with z = (c - c_ref) - (r - r_ref); rpo_alpha > 0 adds rpo_alpha x the
//          chosen completions' token-mean NLL over the micro-batch (RPO)
//   kto    w_d (1 - s(b (d - KL))) for desirable, w_u (1 - s(b (KL - d))) for
//          undesirable, d = logp - logp_ref, KL = max(0, mean over the
//          mismatched rows of (logp - logp_ref)), a constant (detached)
//   orpo   NLL(chosen) - b mean log s(log odds), log odds = (c' - r') -
//          (log(1 - e^c') - log(1 - e^r')), c', r' token-mean log-probabilities
//          (b is ORPO's lambda)
//   simpo  -(1-ls) log s(b (c' - r') - g) - ls log s(-(b (c' - r') - g)) with
//          g = simpo_gamma; cpo_alpha > 0 adds cpo_alpha x NLL(chosen) (CPO-SimPO)
// The loss is the mean over the micro-batch's pairs (KTO: examples).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace nk {

enum class PreferenceMethod { Dpo, Kto, Orpo, Simpo };
enum class DpoLoss { Sigmoid, Robust, Hinge, Ipo };

struct PreferenceLossConfig {
  PreferenceMethod method = PreferenceMethod::Dpo;
  DpoLoss loss_type = DpoLoss::Sigmoid;
  double beta = 0.1;
  double label_smoothing = 0;  // cDPO / robust DPO / SimPO
  double rpo_alpha = 0;        // DPO: weight of the chosen NLL (0: off, TRL's None)
  double simpo_gamma = 0.5;    // SimPO's target reward margin
  double cpo_alpha = 0;        // SimPO: weight of the chosen NLL (CPO-SimPO)
  double desirable_weight = 1, undesirable_weight = 1;  // KTO
  // Whether the loss reads reference log-probabilities (DPO and KTO do).
  bool needs_reference() const {
    return method == PreferenceMethod::Dpo || method == PreferenceMethod::Kto;
  }
};

// One micro-batch: 2 n rows (see above), each its completion's summed
// log-probability and token count.
struct PreferenceBatch {
  std::vector<double> logp;        // policy, [2n]
  std::vector<double> ref_logp;    // reference, [2n] (empty when not needed)
  std::vector<int64_t> tokens;     // completion tokens, [2n], each > 0
  std::vector<uint8_t> desirable;  // KTO: [n]
};

// TRL's logged figures for one micro-batch; the sums and counts let a step
// average them over its micro-batches.
struct PreferenceFigures {
  double chosen_reward_sum = 0, rejected_reward_sum = 0;  // beta x log-ratio (or logp' when
                                                          // reference-free), summed
  double chosen_logp_sum = 0, rejected_logp_sum = 0;      // policy log-probabilities, summed
  int64_t chosen = 0, rejected = 0;                       // how many of each
  double correct = 0;  // pairs whose chosen reward beats the rejected one (paired only)
  double kl = 0;       // KTO's KL estimate
  double nll = 0;      // the chosen NLL term, when the method has one
};

struct PreferenceLossResult {
  double loss = 0;
  std::vector<double> dlogp;  // d loss / d logp of each row, [2n]
  PreferenceFigures figures;
};

// nk::Error naming the row for a malformed batch (odd rows, missing
// reference, a row without tokens).
PreferenceLossResult preference_loss(const PreferenceLossConfig& cfg, const PreferenceBatch& b);

// "dpo", "kto", ... and "sigmoid", "robust", ...: nk::Error naming `key`
// and the choices for another name.
PreferenceMethod parse_preference_method(const std::string& s, const std::string& key);
DpoLoss parse_dpo_loss(const std::string& s, const std::string& key);

}  // namespace nk
