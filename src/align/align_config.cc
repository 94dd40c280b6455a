#include "align/align_config.h"

#include <fmt/ranges.h>

#include "core/error.h"

namespace nk {

void AlignConfig::bind(ConfigBinder& b) {
  b.bind("align.method", method,
         "dpo, ipo, hinge (DPO with that align.loss_type), kto (unpaired data), orpo or simpo "
         "(no reference model); TRL's DPOTrainer, KTOTrainer, ORPOTrainer, CPOTrainer with "
         "loss_type=simpo; NeMo-Aligner's dpo (with preference_loss dpo, ipo); rm: a reward "
         "model (a score head, Bradley-Terry on the pairs: TRL's RewardTrainer, "
         "NeMo-Aligner's train_reward_model; with align.reward_model_type=regression SteerLM's "
         "attribute model); "
         "rs: rejection sampling (best-of-n by a reward model, then SFT); steerlm: SteerLM's "
         "attribute-conditioned SFT; grpo, rloo, ppo: online RL from prompts, the policy "
         "generating as it trains (TRL's GRPOTrainer, RLOOTrainer, PPOTrainer)");
  b.bind("align.loss_type", loss_type,
         "DPO's loss (TRL's DPOConfig.loss_type): sigmoid (DPO; cDPO with "
         "align.label_smoothing), robust (rDPO), hinge (SLiC/RSO) or ipo (IPO, log-ratios "
         "divided by completion lengths as TRL); grpo and rloo: grpo (each sequence's token "
         "mean, then the mean; the default there), dr_grpo (sum / (sequences x "
         "max_completion_length)) or dapo (token-level)");
  b.bind("align.beta", loss.beta,
         "beta: the reward scale, DPO's KL penalty (TRL beta; NeMo-Aligner "
         "dpo.ref_policy_kl_penalty); IPO's tau; KTO's beta; ORPO's lambda; SimPO's beta");
  b.bind("align.label_smoothing", loss.label_smoothing,
         "the probability a label is flipped: cDPO / robust DPO (TRL label_smoothing), "
         "in [0, 0.5)");
  b.bind("align.rpo_alpha", loss.rpo_alpha,
         "DPO: add this times the chosen completions' token-mean NLL (RPO; TRL rpo_alpha, 0 = "
         "None; NeMo-Aligner dpo.sft_loss_weight)");
  b.bind("align.simpo_gamma", loss.simpo_gamma,
         "SimPO's target reward margin gamma (TRL simpo_gamma; SimPO's gamma_beta_ratio is "
         "gamma / beta)");
  b.bind("align.cpo_alpha", loss.cpo_alpha,
         "SimPO: add this times the chosen NLL (TRL cpo_alpha; 0 is plain SimPO, TRL's CPO "
         "default is 1)");
  b.bind("align.desirable_weight", loss.desirable_weight,
         "KTO: weight of the desirable examples' losses (TRL desirable_weight)");
  b.bind("align.undesirable_weight", loss.undesirable_weight,
         "KTO: weight of the undesirable examples' losses (TRL undesirable_weight)");
  b.bind("align.center_rewards_coefficient", center_rewards_coefficient,
         "rm: add this times the mean squared sum of each pair's rewards, keeping them centred "
         "(TRL center_rewards_coefficient; 0 = off)");
  b.bind("align.margin_key", data.margin_key,
         "rm: the key of a pair's margin (chosen must beat rejected by it; TRL's margin "
         "column), read when the records have it");
  b.bind("align.reward_model_type", reward_model_type,
         "rm: binary_ranking (a reward model: Bradley-Terry on pairs) or regression (SteerLM's "
         "attribute model: one output per align.steerlm_attributes name, regressed on "
         "{prompt, response, NAME: value} records; NeMo-Aligner's reward_model_type)");
  b.bind("align.reference", reference,
         "the reference log-probabilities (DPO, KTO): auto (adapter_off with peft.method, "
         "precompute otherwise), precompute (one pass of the initial model before training, "
         "kept in OUT_DIR and reused on resume; TRL precompute_ref_log_probs), copy (a frozen "
         "second copy of the initial model), adapter_off (the policy with its adapters off: "
         "LoRA, IA3 or bottleneck adapters)");
  b.bind("align.data_path", data_path,
         "preference JSONL (plain or zstd): prompt/chosen/rejected as strings or chat message "
         "lists (prompt optional there: the shared leading messages); KTO: "
         "prompt/completion/label");
  b.bind("align.valid_path", valid_path,
         "validation preference JSONL, same form (optional); grpo, rloo, ppo: validation "
         "prompts, as align.data_path's, each given align.num_generations completions by the "
         "live policy every train.val_every steps, their rewards logged as val_reward, "
         "val_rewards/NAME/mean, ...");
  b.bind("align.shuffle", shuffle, "shuffle the examples every epoch (by train.seed)");
  b.bind("align.moe_losses", moe_losses,
         "a Mixture of Experts model: add its load-balancing and router z-losses "
         "(model.moe_aux_loss_coeff, model.moe_z_loss_coeff) to the objective, as pretraining "
         "does (TRL: output_router_logits with router_aux_loss_coef); false: they are logged "
         "and the routers learn from the objective alone");
  b.bind("align.max_prompt_length", data.max_prompt_length,
         "an example longer than train.seq_len keeps the last N tokens of its prompt (TRL "
         "max_prompt_length with truncation_mode=keep_end), then its completions are cut to "
         "fit (0: prompts are never cut, and one leaving no room is an error)");
  b.bind("align.prompt_key", data.prompt_key, "the prompt's key in a record");
  b.bind("align.chosen_key", data.chosen_key, "the chosen completion's key");
  b.bind("align.rejected_key", data.rejected_key, "the rejected completion's key");
  b.bind("align.completion_key", data.completion_key, "KTO: the completion's key");
  b.bind("align.label_key", data.label_key, "KTO: the key of the true/false label");
}

void AlignConfig::check(bool adapters) {
  if (data_path.empty()) fail("align.data_path: the preference JSONL to train on");
  if (data.max_prompt_length < 0)
    fail("align.max_prompt_length: must be >= 0, got {}", data.max_prompt_length);
  if (!(center_rewards_coefficient >= 0))
    fail("align.center_rewards_coefficient: must be >= 0, got {}", center_rewards_coefficient);
  reward_model = method == "rm";
  if (reward_model_type != "binary_ranking" && reward_model_type != "regression")
    fail("align.reward_model_type: '{}' is neither binary_ranking nor regression",
         reward_model_type);
  if (reward_model_type == "regression" && !reward_model)
    fail(
        "align.reward_model_type: regression trains an attribute model with align.method=rm, "
        "not {}",
        method);
  data.margins = reward_model;
  if (reward_model) {
    if (loss_type != "sigmoid")
      fail("align.loss_type: {} is DPO's; align.method=rm trains with the Bradley-Terry loss",
           loss_type);
    if (reference != "auto")
      fail("align.reference: a reward model has no reference model (align.method=rm)");
    if (reward_model_type == "regression") {
      if (attributes.empty()) fail("align.steerlm_attributes: no attribute to regress");
      for (size_t i = 0; i < attributes.size(); ++i)
        for (size_t j = 0; j < i; ++j)
          if (attributes[i] == attributes[j])
            fail("align.steerlm_attributes: '{}' is named twice", attributes[i]);
      if (center_rewards_coefficient > 0)
        fail(
            "align.center_rewards_coefficient: a pairwise reward model's; "
            "align.reward_model_type=regression trains an attribute model");
    } else {
      attributes.clear();
    }
    return;
  }
  attributes.clear();
  if (center_rewards_coefficient > 0)
    fail("align.center_rewards_coefficient: a reward model's (align.method=rm), not {}'s", method);
  if (online()) {  // the loss settings are OnlineRlConfig's; the reference is the KL's
    if (reference == "auto" || reference == (adapters ? "adapter_off" : "copy"))
      reference_source = adapters ? ReferenceSource::AdapterOff : ReferenceSource::Copy;
    else if (reference == "copy")
      reference_source = ReferenceSource::Copy;
    else
      fail(
          "align.reference: '{}' with align.method={}: the KL's reference scores each round's "
          "new completions, so it is the policy with its adapters off (adapter_off, with "
          "peft.method) or a frozen copy (copy)",
          reference, method);
    return;
  }
  if (method == "ipo" || method == "hinge") {
    if (loss_type != "sigmoid" && loss_type != method)
      fail("align.loss_type: '{}' with align.method={} (which sets loss_type={})", loss_type,
           method, method);
    loss_type = method;
    method = "dpo";
  }
  loss.method = parse_preference_method(method, "align.method");
  loss.loss_type = parse_dpo_loss(loss_type, "align.loss_type");
  if (loss.method != PreferenceMethod::Dpo && loss_type != "sigmoid")
    fail("align.loss_type: {} is DPO's; align.method={} has its own loss", loss_type, method);
  if (!(loss.beta > 0)) fail("align.beta: must be positive, got {}", loss.beta);
  const double ls = loss.label_smoothing;
  if (!(ls >= 0 && ls < 0.5)) fail("align.label_smoothing: must be in [0, 0.5), got {}", ls);
  if (ls > 0 && (loss.method == PreferenceMethod::Kto || loss.method == PreferenceMethod::Orpo ||
                 loss.loss_type == DpoLoss::Hinge || loss.loss_type == DpoLoss::Ipo))
    fail("align.label_smoothing: not used by {} (sigmoid and robust DPO, SimPO)",
         loss.method == PreferenceMethod::Dpo ? loss_type : method);
  for (auto [key, v] : {std::pair{"align.rpo_alpha", loss.rpo_alpha},
                        {"align.cpo_alpha", loss.cpo_alpha},
                        {"align.simpo_gamma", loss.simpo_gamma},
                        {"align.desirable_weight", loss.desirable_weight},
                        {"align.undesirable_weight", loss.undesirable_weight}})
    if (!(v >= 0)) fail("{}: must be >= 0, got {}", key, v);
  if (loss.rpo_alpha > 0 && loss.method != PreferenceMethod::Dpo)
    fail("align.rpo_alpha: DPO's; align.method={} (SimPO's NLL weight is align.cpo_alpha)", method);
  if (loss.cpo_alpha > 0 && loss.method != PreferenceMethod::Simpo)
    fail("align.cpo_alpha: SimPO's; align.method={}", method);
  data.unpaired = loss.method == PreferenceMethod::Kto;
  if (reference == "auto")
    reference_source = adapters ? ReferenceSource::AdapterOff : ReferenceSource::Precompute;
  else if (reference == "precompute")
    reference_source = ReferenceSource::Precompute;
  else if (reference == "copy")
    reference_source = ReferenceSource::Copy;
  else if (reference == "adapter_off")
    reference_source = ReferenceSource::AdapterOff;
  else
    fail("align.reference: '{}' is none of auto, precompute, copy, adapter_off", reference);
  if (reference_source == ReferenceSource::AdapterOff && !adapters)
    fail(
        "align.reference: adapter_off needs adapters to switch off (peft.method lora, qlora, "
        "ia3 or adapter); full fine-tuning takes precompute or copy");
}

void set_align_model_keys(Config& c) {
  if (c.get_string("align.method") != "rm") return;
  const bool regression = c.get_string("align.reward_model_type") == "regression";
  const std::vector<std::string> attributes =
      regression ? split_commas(c.get_string("align.steerlm_attributes"))
                 : std::vector<std::string>{};
  const int64_t want = attributes.empty() ? 1 : int64_t(attributes.size());
  const int64_t n = c.get_int("model.num_labels");
  if (n != 0 && n != want)
    fail("model.num_labels: {} with align.method=rm, which trains {} ({})", n, want,
         attributes.empty() ? "one reward" : "one output per align.steerlm_attributes name");
  c.set("model.num_labels", std::to_string(want), "align.method=rm");
  if (!attributes.empty())
    c.set("model.labels", c.get_string("align.steerlm_attributes"),
          "align.reward_model_type=regression");
}

std::map<std::string, std::string> AlignConfig::signature() const {
  std::map<std::string, std::string> s = {
      {"align.data_path", data_path},
      {"align.rows", fmt::format("method {}, max_prompt_length {}, keys {}/{}/{}/{}/{}, "
                                 "shuffle {}{}",
                                 method, data.max_prompt_length, data.prompt_key, data.chosen_key,
                                 data.rejected_key, data.completion_key, data.label_key, shuffle,
                                 reward_model ? ", margin_key " + data.margin_key : "")}};
  if (!attributes.empty())
    s["align.steerlm_attributes"] =
        fmt::format("{} (response key {})", fmt::join(attributes, ","), response_key);
  return s;
}

}  // namespace nk
